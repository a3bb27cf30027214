"""`kvcalc verify` through the CLI: the default run and its JSON contract, the negative controls (exit 0 when
caught wherever they acted, 1 when not, 4 when they never acted), a scenario not exercised (exit 4), bf16, exit 3
without a GPU, bad input (exit 2, one line) and the message when torch is missing."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("torch")

SCENARIOS = ["ragged", "chunked-prefill", "prefix-cache", "parallel-sampling", "beam-search", "preempt-recompute",
             "preempt-swap", "cancel-reuse", "tiny-pool", "speculative", "prefix-chunked", "aligned-repeat",
             "fork-pressure", "evict-return", "async-cancel"]
SCENARIO_KEYS = {"name", "requests", "tokens_compared", "mismatched_tokens", "first_mismatch", "max_abs_logit_diff",
                 "passed", "events"}
EVENT_KEYS = {"prefix_hit_tokens", "cow_copies", "forks", "preemptions", "swaps", "cancellations", "evictions"}


@pytest.fixture(scope="module")
def default_doc():
    """`kvcalc verify --json`: every scenario, fp32, on the CPU here."""
    from typer.testing import CliRunner

    from kvcalc.cli.app import app

    result = CliRunner().invoke(app, ["verify", "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.stdout + result.stderr
    return json.loads(result.stdout)


def test_default_run_json_contract(default_doc):
    doc = default_doc
    assert {"device", "dtype", "attention_backend", "model", "inject", "scenarios", "passed"} <= doc.keys()
    assert (doc["dtype"], doc["inject"], doc["passed"]) == ("fp32", None, True)
    assert doc["model"]["seed"] == 0 and doc["model"]["num_q_heads"] % doc["model"]["num_kv_heads"] == 0
    assert [s["name"] for s in doc["scenarios"]] == SCENARIOS  # all of them, in this order
    for s in doc["scenarios"]:
        assert s.keys() >= SCENARIO_KEYS and s["events"].keys() >= EVENT_KEYS
        assert s["passed"] and s["mismatched_tokens"] == 0 and s["tokens_compared"] > 0
        assert all(s["events"][e] > 0 for e in s["needs"])


def test_table_names_every_scenario_and_the_verdict(run_cli):
    result = run_cli("verify", "--scenario", "ragged", "--scenario", "beam-search")
    assert result.exit_code == 0
    rows = [line.split("│")[1].strip() for line in result.stdout.splitlines() if line.startswith("│")]
    assert rows == ["ragged", "beam-search"]  # only the scenarios asked for, in that order
    assert "max |Δlogit|" in result.stdout and "verdict: all scenarios passed" in result.stdout


@pytest.mark.parametrize(("fault", "scenario"), [
    ("early-free", "cancel-reuse"), ("skip-cow", "parallel-sampling"), ("stale-hash", "prefix-cache"),
    ("no-rollback", "speculative"),
])
def test_each_inject_is_caught_with_exit_1(run_cli, fault, scenario):
    result = run_cli("verify", "--inject", fault, "--scenario", scenario, "--scenario", "ragged", "--json")
    assert result.exit_code == 1  # the negative control did its job: the fault was caught (the run fails)
    doc = json.loads(result.stdout)
    assert doc["inject"] == fault and not doc["passed"] and doc["status"] == "failed"
    caught, untouched = doc["scenarios"]
    assert not caught["passed"] and caught["fault_fired"] > 0 and caught["fault"] == "caught"
    assert untouched["passed"] and untouched["fault_fired"] == 0  # ragged shares nothing: the fault cannot act
    assert untouched["fault"] == "not exercised"
    assert doc["inject_caught_by"] == [scenario] and doc["inject_undetected_in"] == []
    assert doc["inject_not_exercised_in"] == ["ragged"] and doc["inject_status"] == "caught"
    assert doc["inject_fired"] == caught["fault_fired"]


def test_an_inject_with_nothing_to_act_on_exits_4_and_says_so(run_cli):
    result = run_cli("verify", "--inject", "skip-cow", "--scenario", "ragged")
    assert result.exit_code == 4
    assert "NOT EXERCISED: the fault never acted in these scenarios" in result.stdout
    assert "verdict: all scenarios passed" in result.stdout


def test_an_inject_that_acts_unnoticed_exits_5(run_cli, monkeypatch):
    # a check with a hole: the fault acts (fired > 0) but changes nothing a check can see, so the run must
    # say so (exit 5), not report it caught
    from kvcalc.cuda_ext.verify import faults

    def harmless(self, pool):
        release = pool.release

        def counted(seq_id, reason=faults.ReleaseReason.FINISHED):
            self.fired += 1
            release(seq_id, reason)

        pool.release = counted

    monkeypatch.setattr(faults.Fault, "_early_free", harmless)
    result = run_cli("verify", "--inject", "early-free", "--scenario", "ragged", "--json")
    assert result.exit_code == 5
    doc = json.loads(result.stdout)
    assert doc["inject_status"] == "undetected" and doc["inject_undetected_in"] == ["ragged"]
    assert doc["scenarios"][0]["fault"] == "undetected" and doc["scenarios"][0]["passed"]


def test_inject_table_says_what_caught_it(run_cli):
    result = run_cli("verify", "--inject", "stale-hash", "--scenario", "prefix-cache")
    assert result.exit_code == 1
    assert "FAIL (tokens, content, invariants, error); fault caught" in result.stdout
    assert "CAUGHT wherever it acted" in result.stdout and "caught by prefix-cache" in result.stdout
    assert "verdict: FAILED" in result.stdout


def test_a_scenario_missing_its_events_is_not_exercised_exit_4(run_cli, monkeypatch):
    # ragged's end-of-sequence token chosen where no request produces it: no EOS finish, every token still
    # right -> "not exercised", not "failed"
    from kvcalc.cuda_ext.verify import scheduled

    real_references = scheduled.references

    def no_eos(weights, requests, seed, *args, **kw):
        generations, _, _ = real_references(weights, requests, seed, *args, **kw)
        return generations, [len(g.output_ids) for g in generations], None

    monkeypatch.setattr(scheduled, "references", no_eos)
    result = run_cli("verify", "--scenario", "ragged", "--json")
    assert result.exit_code == 4
    doc = json.loads(result.stdout)
    (s,) = doc["scenarios"]
    assert s["status"] == "not exercised" and s["missing_events"] == ["eos_finishes"] and s["mismatched_tokens"] == 0
    assert doc["status"] == "not exercised" and not doc["passed"]
    table = run_cli("verify", "--scenario", "ragged")
    assert table.exit_code == 4 and "not exercised (events)" in table.stdout and "EOS 0!" in table.stdout
    assert "verdict: NOT EXERCISED" in table.stdout


def test_bf16_passes_by_the_top_k_rule(run_cli):
    result = run_cli("verify", "--dtype", "bf16", "--scenario", "parallel-sampling", "--json")
    assert result.exit_code == 0
    doc = json.loads(result.stdout)
    assert doc["dtype"] == "bf16" and doc["passed"] and "top 5" in doc["pass_rule"]["tokens"]


def test_cuda_without_gpu_is_one_line_exit_3(run_cli):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is visible here")
    result = run_cli("verify", "--device", "cuda", "--scenario", "ragged")
    assert result.exit_code == 3 and result.stdout == ""
    assert result.stderr == "error: --device cuda: torch sees no CUDA GPU here; use --device cpu (or auto)\n"


@pytest.mark.parametrize("scenario", ["speculative", "ragged", "beam-search"])
def test_a_kernel_that_cannot_run_mid_scenario_exits_3_not_1(run_cli, monkeypatch, scenario):
    # a GPU is visible but the CUDA kernel cannot be built: the first paged forward raises CudaUnavailableError
    # inside the run; every scenario (the speculative one too: one run path) lets it up -> exit 3, not a failure
    from kvcalc.core.errors import CudaUnavailableError
    from kvcalc.cuda_ext.verify import executor

    def unbuildable(*args, **kw):
        raise CudaUnavailableError("the CUDA extension cannot be built here (no nvcc); use --device cpu")

    monkeypatch.setattr(executor, "paged_forward", unbuildable)
    result = run_cli("verify", "--scenario", scenario, "--json")
    assert result.exit_code == 3 and result.stdout == ""
    assert result.stderr == "error: the CUDA extension cannot be built here (no nvcc); use --device cpu\n"


@pytest.mark.parametrize(("args", "message"), [
    (("--scenario", "nope"), "error: --scenario 'nope' is not known; use one or more of ragged,"),
    (("--scenario", "ragged", "--scenario", "ragged"), "error: --scenario ragged is given twice"),
    (("--dtype", "fp8"), "error: --dtype 'fp8' is not one of fp32, bf16, fp16"),
    (("--device", "gpu"), "error: --device 'gpu' is not one of auto, cpu, cuda"),
    (("--inject", "double-free"), "error: --inject 'double-free' is not a known fault; use one of early-free,"),
    (("--seed", "-1"), "error: --seed -1 is negative"),
    # the second used to replace the first silently: the user believed both faults planted
    (("--inject", "early-free", "--inject", "skip-cow"),
     "error: --inject is given twice ('early-free' and 'skip-cow')"),
    (("--inject", ""), "error: --inject '' is not a known fault"),
    (("--json", "--format", "csv"), "error: "),
    (("--model", "smollm2-135m", "--hf-model", "docs"), "error: --model and --hf-model both name the weights"),
])
def test_bad_input_is_one_line_exit_2(run_cli, args, message):
    result = run_cli("verify", *args)
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.startswith(message) and result.stderr.count("\n") == 1


def test_csv_has_one_row_per_scenario_with_every_event(run_cli):
    result = run_cli("verify", "--scenario", "tiny-pool", "--format", "csv")
    assert result.exit_code == 0
    header, row = [line for line in result.stdout.splitlines() if line and not line.startswith("#")]
    columns = dict(zip(header.split(","), row.split(","), strict=True))
    assert columns["name"] == "tiny-pool" and columns["passed"] == "true"
    assert int(columns["event_evictions"]) > 0 and int(columns["event_swaps"]) > 0


def test_without_torch_says_how_to_install(tmp_path):
    # A stub module that fails to import stands in for a missing torch (as in the bench tests).
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("raise ImportError('no torch here')\n")
    code = f"import sys; sys.path.insert(0, {str(tmp_path)!r}); from kvcalc.cli.app import main; main()"
    proc = subprocess.run([sys.executable, "-c", code, "verify"], capture_output=True, text=True, check=False)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == ("error: kvcalc verify needs PyTorch, which is not installed: pip install 'kvcalc[bench]' "
                           "(on a machine without a GPU, first the CPU build: pip install torch --index-url "
                           "https://download.pytorch.org/whl/cpu)\n")


def test_markdown_escapes_the_bars_of_max_delta_logit(run_cli):
    result = run_cli("verify", "--scenario", "beam-search", "--format", "markdown")
    assert result.exit_code == 0
    header = next(line for line in result.stdout.splitlines() if line.startswith("| scenario"))
    assert "max \\|Δlogit\\|" in header and header.count(" | ") == 6  # seven cells, six inner separators


def test_hf_model_given_config_json_asks_for_its_folder(run_cli, tmp_path) -> None:
    config = tmp_path / "config.json"
    config.write_text("{}")
    result = run_cli("verify", "--device", "cpu", "--hf-model", str(config))
    assert result.exit_code == 2
    assert result.stderr == (f"error: --hf-model {config} is a file: give the folder that holds config.json "
                             f"(--hf-model {tmp_path})\n")


def test_model_smollm2_runs_a_scenario_on_real_chat_prompts(run_cli):
    from kvcalc.cuda_ext.verify.gguf_model import ModelNotInstalledError, find_gguf

    try:
        find_gguf("smollm2-135m")
        import gguf  # noqa: F401
    except (ModelNotInstalledError, ImportError) as exc:
        pytest.skip(f"the model is not installed: {exc}")
    result = run_cli("verify", "--device", "cpu", "--model", "smollm2-135m", "--scenario", "aligned-repeat", "--json")
    assert result.exit_code == 0, result.stdout[-2000:]
    doc = json.loads(result.stdout)
    assert doc["model"]["weights"] == "smollm2-135m" and doc["model"]["num_layers"] == 30
    (s,) = doc["scenarios"]
    assert s["passed"] and s["mismatched_tokens"] == 0 and s["events"]["capped_hits"] > 0
    assert s["max_abs_logit_diff"] <= s["logit_tolerance"]
    text = doc["texts"][0]
    assert text["identical"] and text["reference"] == text["paged"] and text["user"].endswith("?")
