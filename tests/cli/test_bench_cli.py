"""`kvcalc bench` through the CLI: the --device cpu run and its JSON contract, the exit-3 path without a
GPU, bad input (exit 2, one line), --save, and the message when torch is missing."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("torch")

TIMING_KEYS = {"batch", "context", "block_size", "paged_us", "contiguous_us", "paged_over_contiguous", "bytes",
               "achieved_tbps", "fraction_of_copy"}
CORRECTNESS_KEYS = {"dtype", "head_dim", "group_size", "block_size", "max_abs_err", "rel_err",
                    "paged_vs_contiguous_max_diff", "passed"}
SMALL = ("--device", "cpu", "--batch", "2", "--context", "40", "--iters", "1", "--warmup", "0")


@pytest.fixture(scope="module")
def cpu_doc():
    """One full `kvcalc bench --device cpu --json` run (the correctness grid included) for the module."""
    from typer.testing import CliRunner

    from kvcalc.cli.app import app

    result = CliRunner().invoke(app, ["bench", *SMALL, "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def test_cpu_json_contract(cpu_doc):
    assert cpu_doc["device"]["type"] == "cpu"
    assert cpu_doc["device"]["label"] == "reference implementation on CPU"
    assert cpu_doc["implementation"] == "reference implementation on CPU"
    assert cpu_doc["copy_tbps"] is None  # a copy ceiling is a CUDA measurement
    assert {"device", "copy_tbps", "correctness", "timing"} <= cpu_doc.keys()
    # 2 dtypes x 3 head dims x 3 groups x 3 block sizes
    assert len(cpu_doc["correctness"]) == 54
    for row in cpu_doc["correctness"]:
        assert row.keys() >= CORRECTNESS_KEYS
        assert row["passed"] and row["rel_err"] < row["tolerance"]
        assert row["paged_vs_contiguous_max_diff"] == 0.0
    assert cpu_doc["paged_vs_contiguous"]["bit_identical"] is True
    (timing,) = cpu_doc["timing"]
    assert timing.keys() >= TIMING_KEYS
    assert (timing["batch"], timing["context"], timing["block_size"]) == (2, 40, 16)
    # 2 x 40 tokens x 8 KV heads x 128 x 2 bytes x (K, V) + q/out 2 x 2 x 32 x 128 x 2 + tables 2 x 3 x 4 + lens 8
    assert timing["bytes"] == 327680 + 32768 + 24 + 8
    assert timing["fraction_of_copy"] is None
    assert cpu_doc["passed"] is True


def test_cpu_table_output_is_labelled(run_cli):
    result = run_cli("bench", *SMALL, "--skip-correctness")
    assert result.exit_code == 0, result.stderr
    assert "reference implementation on CPU" in result.stdout
    assert "paged CPU µs" in result.stdout
    # no reference grid ran: the output must not claim that checks passed
    assert "all checks passed" not in result.stdout and "not checked against the reference" in result.stdout


def test_sweep_block_and_save(run_cli, tmp_path):
    target = tmp_path / "bench.json"
    result = run_cli("bench", *SMALL, "--skip-correctness", "--sweep-block", "--json", "--save", str(target))
    assert result.exit_code == 0, result.stderr
    doc = result.json()
    assert [row["block_size"] for row in doc["block_sweep"]] == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert doc["correctness"] == [] and doc["correctness_checked"] is False
    assert json.loads(target.read_text()) == doc


def test_cuda_without_gpu_is_one_line_exit_3(run_cli):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the no-GPU path cannot be exercised")
    result = run_cli("bench", "--device", "cuda")
    assert result.exit_code == 3
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
    assert "CUDA" in result.stderr and "--device cpu" in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize(("args", "message"), [
    (("--device", "tpu"), "--device 'tpu'"),
    (("--device", "cpu", "--dtype", "fp8"), "--dtype 'fp8'"),
    (("--device", "cpu", "--head-dim", "96"), "--head-dim 96"),
    (("--device", "cpu", "--q-heads", "12", "--kv-heads", "8"), "--q-heads 12"),
    (("--device", "cpu", "--q-heads", "40", "--kv-heads", "2"), "--q-heads 40"),
    (("--device", "cpu", "--block-size", "12"), "--block 12"),
    (("--device", "cpu", "--block", "512"), "--block 512"),
    (("--device", "cpu", "-b", "0"), "--block 0"),
    (("--device", "cpu", "--kv-heads", "0"), "--kv-heads 0 must be at least 1"),
    (("--device", "cpu", "--q-heads", "0", "--kv-heads", "8"), "--q-heads 0 must be 1 to 16 times --kv-heads 8"),
    (("--device", "cpu", "--warmup", "-1"), "--warmup -1 must be 0 or more"),
    (("--device", "cpu", "--batch", "0"), "--batch 0"),
    (("--device", "cpu", "--iters", "0"), "--iters 0"),
    (("--device", "cpu", "--splits", "0"), "--splits 0"),
    (("--device", "cpu", "--batch", "two"), "--batch"),
    (("--device", "cpu", "--seed", "-1"), "--seed -1 is negative: give a whole number from 0 to 2**63-1"),
    (("--device", "cpu", "--seed", "2**64"), "--seed '2**64' is not an integer"),
    (("--device", "cpu", "--seed", "1e19"), "--seed 10000000000000000000 is too large"),
    # these ran for ever, or raised OverflowError from a float division
    (("--device", "cpu", "--iters", "1e18"), "--iters 1000000000000000000 is more than 100,000 runs"),
    (("--device", "cpu", "--warmup", "1e400"), "--warmup 1.000e+400 is more than 100,000 runs"),
    (("--device", "cpu", "--batch", "1", "--context", "1e400"), "--context 1.000e+400 (block size 16) need"),
    (("--device", "cpu", "--head-dim", "1e400"), "--head-dim 1.000e+400 is not supported"),
])
def test_bad_input_is_one_line_exit_2(run_cli, args, message):
    result = run_cli("bench", *args)
    assert result.exit_code == 2
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
    assert message in result.stderr


def _bench_without_torch(tmp_path, *args):
    # A stub module that fails to import stands in for a missing torch (a venv of the quick start's first step).
    (tmp_path / "torch").mkdir(exist_ok=True)
    (tmp_path / "torch" / "__init__.py").write_text("raise ImportError('no torch here')\n")
    code = f"import sys; sys.path.insert(0, {str(tmp_path)!r}); from kvcalc.cli.app import main; main()"
    return subprocess.run([sys.executable, "-c", code, "bench", *args], capture_output=True, text=True, check=False)


@pytest.mark.parametrize("args", [("--device", "cpu"), ()])
def test_without_torch_says_how_to_install(tmp_path, args):
    proc = _bench_without_torch(tmp_path, *args)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == ("error: kvcalc bench needs PyTorch, which is not installed: pip install 'kvcalc[bench]' "
                           "(on a machine without a GPU, first the CPU build: pip install torch --index-url "
                           "https://download.pytorch.org/whl/cpu)\n")


def test_cuda_without_torch_is_exit_3_with_the_install_line(tmp_path):
    proc = _bench_without_torch(tmp_path, "--device", "cuda")
    assert proc.returncode == 3 and proc.stdout == ""
    assert proc.stderr == ("error: --device cuda needs PyTorch with CUDA, which is not installed: "
                           "pip install 'kvcalc[bench]'\n")


def test_help_does_not_import_torch():
    code = "import sys; from kvcalc.cli.app import app; assert 'torch' not in sys.modules, 'torch imported'"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr


def test_cuda_shaped_report_renders(capsys, monkeypatch):
    # The CUDA branch of the harness and of the report, driven on the CPU: the reference stands in for the
    # kernel, SDPA runs for real, a comparator that raises is recorded, not fatal.
    import torch

    from kvcalc.cli.bench import _report
    from kvcalc.cli.output import Format, emit
    from kvcalc.cuda_ext import bench
    from kvcalc.cuda_ext.backends import CpuReferenceBackend, sdpa_op
    from kvcalc.cuda_ext.bench import BenchConfig, run_bench
    from kvcalc.cuda_ext.timing import cpu_median_us

    monkeypatch.setitem(bench.SWEEP_SHAPE, "cuda", (1, 32))  # not the GPU's 64 x 4K on this CPU

    def broken(x):
        raise RuntimeError("flex is not here")

    config = BenchConfig(device="cuda", shapes=((2, 48),), iters=1, warmup=0, correctness=False, sweep_block=True)
    info = {"type": "cuda", "name": "Fake GPU", "driver": "0.0", "cuda": "13.0", "torch": torch.__version__}
    doc = run_bench(config, CpuReferenceBackend(), device=torch.device("cpu"), device_info=info, copy_tbps=2.0,
                    tick=lambda _: None, time_op=lambda op, prepare: cpu_median_us(op, prepare, iters=1, warmup=0),
                    extra_timers={"sdpa_us": sdpa_op, "flex_paged_us": broken})
    (row,) = doc["timing"]
    assert row["sdpa_us"] > 0 and row["flex_paged_us"] is None
    assert row["flex_paged_error"] == "RuntimeError: flex is not here"
    assert row["fraction_of_copy"] == pytest.approx(row["achieved_tbps"] / 2.0)
    assert "sdpa_us" not in doc["block_sweep"][0]  # comparators run on the main shapes only
    emit(_report(doc), Format.table)
    out = capsys.readouterr().out
    assert "Fake GPU" in out and "SDPA µs" in out and "flex paged µs" in out and "copy ceiling 2.000 TB/s" in out


def test_sdpa_comparator_matches_reference_on_cpu():
    import torch

    from kvcalc.cuda_ext.backends import sdpa_op
    from kvcalc.cuda_ext.bench import make_inputs
    from kvcalc.cuda_ext.reference import decode_attention_reference

    x = make_inputs([32, 32], 8, 2, 64, 16, torch.float64, "cpu", torch.Generator().manual_seed(0))
    out = sdpa_op(x)().squeeze(2)
    torch.testing.assert_close(out, decode_attention_reference(x.q, x.k, x.v, x.seq_lens))


def test_an_output_left_unwritten_in_a_timed_run_fails_the_bench():
    # The output is poisoned (NaN) before every timed run; a kernel that skips writing it must not pass.
    import torch

    from kvcalc.cuda_ext.backends import CpuReferenceBackend
    from kvcalc.cuda_ext.bench import BenchConfig, run_bench
    from kvcalc.cuda_ext.timing import cpu_median_us

    class LazyBackend(CpuReferenceBackend):
        def paged(self, x, num_splits):
            return x.out if x.out is not None else super().paged(x, num_splits)

    config = BenchConfig(device="cpu", shapes=((1, 16),), iters=1, warmup=0, correctness=False)
    doc = run_bench(config, LazyBackend(), device=torch.device("cpu"), device_info={"type": "cpu"}, copy_tbps=None,
                    tick=lambda _: None, time_op=lambda op, prepare: cpu_median_us(op, prepare, iters=1, warmup=0))
    assert doc["timing"][0]["timed_outputs_match"] is False
    assert doc["passed"] is False


@pytest.mark.parametrize("flag", ["--head-dim", "--q-heads", "--kv-heads", "--batch", "--context", "--block",
                                  "--block-size", "--iters", "--warmup", "--splits", "--seed"])
def test_every_integer_option_says_not_an_integer_the_same_way(run_cli, flag):
    # the wording of size/frag, not pydantic's "Input should be a valid integer"
    result = run_cli("bench", "--device", "cpu", flag, "abc")
    assert result.exit_code == 2
    named = "--block" if flag == "--block-size" else flag  # the alias is reported under the option's name
    assert result.stderr.startswith(f"error: {named} 'abc' is not an integer: write a whole number")
    assert result.stderr.count("\n") == 1


def test_integer_spellings_are_read_exactly(run_cli):
    # 3e1 = 30, 1_0 = 10, 1e0 = 1: the timed shape and config say the plain values
    result = run_cli("bench", "--device", "cpu", "--batch", "1e0", "--context", "3e1", "--iters", "1.0",
                     "--warmup", "0e3", "--block", "1_6", "--skip-correctness", "--no-flex", "--json")
    assert result.exit_code == 0, result.stderr
    doc = result.json()
    assert (doc["timing"][0]["batch"], doc["timing"][0]["context"], doc["timing"][0]["block_size"]) == (1, 30, 16)
    assert (doc["config"]["iters"], doc["config"]["warmup"]) == (1, 0)


def test_save_into_a_missing_directory_is_refused_before_the_run(run_cli, tmp_path):
    # the directory is named (as frag --plot), not "no such file"; checked before any timing
    target = tmp_path / "missing" / "b.json"
    result = run_cli("bench", *SMALL, "--save", str(target))
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr == (f"error: --save {target}: the directory {target.parent} does not exist; "
                             "create it or write the file elsewhere\n")


def test_a_failing_comparator_is_recorded_after_the_row_fields_in_order():
    # TimingRow.to_dict: the row's fields, then each comparator's time and, when it raised, its *_error.
    import torch

    from kvcalc.cuda_ext.backends import CpuReferenceBackend
    from kvcalc.cuda_ext.bench import BenchConfig, run_bench
    from kvcalc.cuda_ext.timing import cpu_median_us

    def broken(x):
        raise RuntimeError("no  such\nkernel")

    config = BenchConfig(device="cpu", shapes=((1, 16),), iters=1, warmup=0, correctness=False)
    doc = run_bench(config, CpuReferenceBackend(), device=torch.device("cpu"), device_info={"type": "cpu"},
                    copy_tbps=None, tick=lambda _: None,
                    time_op=lambda op, prepare: cpu_median_us(op, prepare, iters=1, warmup=0),
                    extra_timers={"broken_us": broken, "none_us": lambda x: None})
    row = doc["timing"][0]
    assert list(row)[-4:] == ["timed_outputs_match", "broken_us", "broken_error", "none_us"]
    assert row["broken_us"] is None and row["broken_error"] == "RuntimeError: no such kernel"
    assert row["none_us"] is None and doc["passed"] is True
