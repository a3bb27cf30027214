"""`kvcalc sim` options: one rule with `kvcalc size` for --tp, no silent defaults, finite numbers only, options
that do not apply are refused."""

from __future__ import annotations

import pytest

from kvcalc.core.model.models import get_preset
from kvcalc.core.sim.hardware import kv_bytes_per_token_per_gpu

TINY = ("--requests", "3", "--rate", "4")


def one_error_line(result) -> str:
    assert result.exit_code == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


# ---- --tp: the rule of kvcalc size ------------------------------------------------------------------------------
@pytest.mark.parametrize(("model", "tp"), [("Llama-3-8B", 3), ("OPT-13B", 3), ("Llama-3-8B", 12)])
def test_tp_that_size_refuses_is_refused_with_the_same_line(run_cli, model, tp):
    size = one_error_line(run_cli("size", "--model", model, "--tp", str(tp)))
    sim = one_error_line(run_cli("sim", *TINY, "--model", model, "--gpu", "H200", "--tp", str(tp)))
    assert sim == size


@pytest.mark.parametrize(("model", "tp", "expected"), [
    ("Llama-3-8B", 2, 32 * 2 * 4 * 128 * 2),  # 8 KV heads / 2 = 4 per GPU: 32 layers · 2 (K,V) · 4 · 128 · 2 B = 65,536
    ("Llama-3-8B", 16, 32 * 2 * 1 * 128 * 2),  # tp 16 > 8 heads: one head per GPU, each on 2 GPUs: 16,384
    ("DeepSeek-V3", 8, 61 * (512 + 64) * 2),  # MLA latent replicated on every GPU, no factor 2: 70,272
])
def test_kv_bytes_per_gpu_equal_size(run_cli, model, tp, expected):
    assert kv_bytes_per_token_per_gpu(get_preset(model), 16, tp) == expected
    size = run_cli("size", "--model", model, "--tp", str(tp), "--json")
    assert size.exit_code == 0, size.stderr
    assert str(expected) in size.stdout  # size reports the same per-GPU bytes per token


# ---- no silent defaults ------------------------------------------------------------------------------------------
def test_max_model_len_zero_is_refused_not_the_default(run_cli):
    assert "--max-model-len" in one_error_line(run_cli("sim", *TINY, "--max-model-len", "0"))


# ---- finite numbers -----------------------------------------------------------------------------------------------
CUSTOM = ("--gpu-memory", "80GiB", "--bandwidth", "1e12", "--flops", "1e15")


@pytest.mark.parametrize(("args", "needle"), [
    (("--gpu-memory", "80GiB", "--bandwidth", "1e12", "--flops", "inf"), "--flops inf"),
    (("--gpu-memory", "80GiB", "--bandwidth", "1e12", "--flops", "nan"), "--flops nan"),
    (("--gpu-memory", "1e400", "--bandwidth", "1e12", "--flops", "1e15"), "--gpu-memory 1e400"),
    (("--gpu-memory", "80GiB", "--bandwidth", "1e400", "--flops", "1e15"), "--bandwidth 1e400"),
    (("--gpu-memory", "1e27", "--bandwidth", "1e12", "--flops", "1e15"), "limit of 16,777,216"),
    (("--gpu-memory", "80GiB", "--bandwidth", "1e12", "--flops", "1e-300"), "--flops"),
    (("--step-overhead-ms", "inf"), "--step-overhead-ms inf"),
    (("--step-overhead-ms", "nan"), "--step-overhead-ms nan"),
    (("--timeout", "nan"), "--timeout nan"),
    (("--rate", "1e400"), "--rate 1e400"),
    (("--rate", "nan"), "--rate nan"),
    (("--rate", "1e-300"), "--rate 1e-300"),
    (("--slo", "ttft=1e400"), "--slo"),
    (("--preempt", "swap", "--swap-bandwidth", "0"), "--swap-bandwidth 0: must be a positive number of bytes/s"),
    (("--preempt", "swap", "--swap-bandwidth", "1e400"), "--swap-bandwidth 1e400"),
    (("--weights-bytes", "1e400"), "--weights-bytes 1e400"),
    (("--workspace-bytes", "1e400"), "--workspace-bytes 1e400"),
    (("--arrival", "gamma", "--burstiness", "inf"), "--burstiness"),
])
def test_non_finite_and_overflowing_numbers_are_one_line(run_cli, args, needle):
    line = one_error_line(run_cli("sim", "--requests", "3", *args))
    assert needle in line
    assert "Warning" not in line


def test_documented_infinities_still_mean_what_they_say(run_cli):
    offline = run_cli("sim", "--requests", "3", "--rate", "inf", "--json")  # every request at time 0
    assert offline.exit_code == 0 and offline.stderr == ""
    assert "arrivals at inf/s" in offline.json()["workload"]["description"]
    no_timeout = run_cli("sim", *TINY, "--timeout", "inf", "--json")
    default = run_cli("sim", *TINY, "--json")
    assert no_timeout.exit_code == 0 and no_timeout.stderr == ""
    assert no_timeout.json()["policies"] == default.json()["policies"]


# ---- options that do not apply -------------------------------------------------------------------------------------
@pytest.fixture
def azure(tmp_path):
    path = tmp_path / "azure.csv"
    rows = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    rows += [f"2023-11-16 18:15:{10 + i:02d}.0000000,{100 + i},{5 + i}" for i in range(4)]
    path.write_text("\n".join(rows) + "\n")
    return str(path)


@pytest.mark.parametrize("args", [
    ("--rate", "5"), ("--requests", "5"), ("--prompt-dist", "uniform:low=1,high=9"),
    ("--output-dist", "uniform:low=1,high=9"), ("--arrival", "gamma"), ("--burstiness", "0.5"),
    ("--rate", "1"),  # the default value, given explicitly, is still misplaced
])
def test_constructed_options_with_a_trace_are_refused(run_cli, azure, args):
    line = one_error_line(run_cli("sim", "--trace", "azure", azure, *args))
    assert args[0] in line and "constructed workload" in line


@pytest.mark.parametrize(("args", "needle"), [
    (("--limit", "2"), "--limit applies to --trace"),
    (("--time-scale", "2"), "--time-scale applies to --trace"),
    (("--burstiness", "0.5"), "--burstiness 0.5 applies to --arrival gamma"),
    (("--arrival", "poisson", "--burstiness", "1"), "applies to --arrival gamma"),
    (("--attainment", "0.5"), "--attainment 0.5 applies to --max-rate"),
    (("--policy", "reserve-max", "--compare", "paged"), "not both"),
    (("--compare", "paged,paged"), "names paged twice"),
    (("--compare", "paged,,reserve-max"), "empty name"),
    (("--compare", ""), "empty name"),
    (("--policy", "paged,reserve-max"), "use --compare"),
    (("--slo", "ttft=2,ttft=3"), "ttft is given twice"),
    (("--requests", "100000000"), "limit of 1,000,000"),
])
def test_misplaced_or_ambiguous_options_are_refused(run_cli, args, needle):
    assert needle in one_error_line(run_cli("sim", *TINY[2:], *args) if args[0] == "--requests"
                                    else run_cli("sim", *TINY, *args))


def test_trace_options_still_work_with_a_trace(run_cli, azure):
    result = run_cli("sim", "--trace", "azure", azure, "--limit", "2", "--time-scale", "2", "--json")
    assert result.exit_code == 0, result.stderr
    assert result.json()["requests"] == 2


# ---- wording ---------------------------------------------------------------------------------------------------------
def test_workload_kind_is_said_once_and_counts_agree_in_number(run_cli, azure):
    one = run_cli("sim", "--requests", "1", "--rate", "inf")
    assert one.exit_code == 0, one.stderr
    assert "workload is constructed: 1 request, Poisson arrivals" in one.stdout
    assert "constructed: constructed" not in one.stdout and "1 requests" not in one.stdout
    trace = run_cli("sim", "--trace", "azure", azure)
    assert "workload is real: azure trace" in trace.stdout and "real trace" not in trace.stdout
    assert "(4 requests)" in trace.stdout


@pytest.mark.parametrize(("args", "needle"), [
    (("--arrival", ""), "--arrival ''"),
    (("--prompt-dist", ""), "unknown distribution ''"),
    (("--output-dist", ""), "unknown distribution ''"),
    (("--gpu", ""), "unknown GPU ''"),
])
def test_an_empty_value_is_an_error_not_the_default(run_cli, args, needle):
    assert needle in one_error_line(run_cli("sim", *TINY, *args))


def test_help_shows_every_default_written_in_the_text(run_cli, monkeypatch):
    # "[poisson]" / "[the model's max]" were eaten as rich markup ("prompt + output ."); now "(default: …)"
    monkeypatch.setenv("COLUMNS", "250")  # wide enough that rich folds no help text
    result = run_cli("sim", "--help")
    assert result.exit_code == 0
    text = " ".join(result.stdout.replace("│", " ").split())
    for needle in ("prompt + output tokens (default: the model's max_position_embeddings)",
                   "arrivals (default: poisson)", "reserve-oracle (default: paged)", "(default: A100-40GB)",
                   "at most 1,000,000 (default: 1,000)"):
        assert needle in text
    assert " ." not in text


def test_bits_spelling_is_refused_and_lower_case_is_bytes(run_cli):
    # "25Gb" (capital prefix, lower-case b) is bits -> refused; "25gb" is read as 25·10^9 bytes/s
    line = one_error_line(run_cli("sim", *TINY, "--preempt", "swap", "--swap-bandwidth", "25Gb"))
    assert "'25Gb' is how bits are written" in line and "did you mean 25GB (bytes)?" in line
    lower = run_cli("sim", *TINY, "--preempt", "swap", "--swap-bandwidth", "25gb", "--json")
    upper = run_cli("sim", *TINY, "--preempt", "swap", "--swap-bandwidth", "25GB", "--json")
    assert lower.exit_code == 0, lower.stderr
    assert lower.json() == upper.json()


# ---- options given explicitly that would change nothing ------------------------------------------------------
@pytest.mark.parametrize("args", [
    ("--swap-bandwidth", "1KB"),
    ("--swap-bandwidth", "25GB"),  # the default value, given explicitly, is still ignored without swapping
    ("--swap-bandwidth", "1KB", "--preempt", "recompute"),
])
def test_swap_bandwidth_without_swapping_is_refused(run_cli, args):
    assert "--swap-bandwidth applies to --preempt swap" in one_error_line(run_cli("sim", *TINY, *args))


def test_swap_bandwidth_with_swapping_and_the_default_are_the_same_run(run_cli):
    # the default swap bandwidth is 25GB: giving it explicitly with --preempt swap changes nothing
    explicit = run_cli("sim", *TINY, "--preempt", "swap", "--swap-bandwidth", "25GB", "--json")
    default = run_cli("sim", *TINY, "--preempt", "swap", "--json")
    assert explicit.exit_code == 0, explicit.stderr
    assert explicit.json() == default.json()


def test_seed_with_a_trace_needs_cancellations(run_cli, azure):
    # a trace fixes arrivals and lengths; the seed only picks the cancelled requests
    line = one_error_line(run_cli("sim", "--trace", "azure", azure, "--seed", "3"))
    assert "--seed with --trace only picks the cancelled requests" in line
    line = one_error_line(run_cli("sim", "--trace", "azure", azure, "--seed", "0"))  # the default, given: refused
    assert "add --cancel-fraction or drop --seed" in line
    with_cancel = run_cli("sim", "--trace", "azure", azure, "--seed", "3", "--cancel-fraction", "0.5", "--json")
    assert with_cancel.exit_code == 0, with_cancel.stderr
    # 4 requests, cancel fraction 0.5: 2 cancelled
    assert with_cancel.json()["cancelled"] == 2


def test_seed_of_constructed_samples_defaults_to_zero(run_cli):
    explicit = run_cli("sim", *TINY, "--seed", "0", "--json")
    default = run_cli("sim", *TINY, "--json")
    assert explicit.json() == default.json()
    assert run_cli("sim", *TINY, "--seed", "1", "--json").json() != default.json()


# ---- integer options past their bounds, checked before any arithmetic -----------------------------------------------
@pytest.mark.parametrize(("args", "needle"), [
    (("--tp", "1e400", "--json"), "--tp 1.000e+400 is above its limit of 1,024 GPUs"),  # was an OverflowError
    (("--tp", "1025"), "--tp 1025 is above its limit of 1,024"),
    (("--block", "1e400"), "--block 1.000e+400 is above its limit of 2,147,483,647"),  # plan_memory overflowed
    (("--block", "3e9"), "--block 3000000000 is above its limit"),  # blamed the weights
    (("--max-batched-tokens", "1e400"), "--max-batched-tokens 1.000e+400 is above its limit"),
    (("--max-seqs", "1e400"), "--max-seqs 1.000e+400 is above its limit"),
    (("--policy", "reserve-max", "--max-model-len", "1e400", "--json"), "--max-model-len 1.000e+400 is above"),
    (("--spec-tokens", "1e400"), "--spec-tokens 1.000e+400 is above"),  # echoed 401 digits
    (("--timeout", "1e400"), "--timeout 1e400: give a finite number (1e400 overflows a float)"),  # became inf
])
def test_integer_options_past_their_bounds_are_one_line(run_cli, args, needle):
    assert needle in one_error_line(run_cli("sim", *TINY, *args))


def test_a_block_larger_than_the_pool_names_block_not_the_weights(run_cli):
    # OPT-13B: 40 layers · 2 (K, V) · 5,120 · 2 B = 819,200 B per token; 10^9 tokens = 762,939 GiB, far above
    # the 9.65 GiB (10,357,296,660 B) that A100-40GB leaves after the weights and workspace.
    # (--layout ideal: kvcalc's own pool takes any block size; vLLM's takes 1 to 256 only, see below)
    line = one_error_line(run_cli("sim", *TINY, "--layout", "ideal", "--block", "1e9"))
    # the largest block that fits the pool (10,357,296,660 B today, sim --json's kv_pool_bytes):
    # 10,357,296,660 // 819,200 = 12,643 (12,643 · 819,200 = 10,357,145,600; 12,644 · 819,200 = 10,357,964,800)
    assert "--block 1000000000: one KV block needs 762939.45 GiB" in line and "use --block 12643 or smaller" in line
    assert "larger GPU" not in line


def test_bounds_are_in_the_help(run_cli, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")  # wide enough that rich folds no help text
    help_text = " ".join(run_cli("sim", "--help").stdout.replace("│", " ").split())
    assert "at most 1,024" in help_text and "at most 2,147,483,647" in help_text


def test_mooncake_block_size_names_the_flag(run_cli, tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 1000, "output_length": 10, "hash_ids": [1, 2]}\n')
    assert "error: --block 768 does not divide 512 and is not a multiple of it" in one_error_line(
        run_cli("sim", "--trace", "mooncake", str(path), "--layout", "ideal", "-b", "768"))
    assert "--block 1.000e+400 is above its limit" in one_error_line(
        run_cli("sim", "--trace", "mooncake", str(path), "-b", "1e400"))


def test_mooncake_trace_with_ids_on_some_lines_only_and_an_empty_path(run_cli, tmp_path):
    line = '{"timestamp": 0, "input_length": 1000, "output_length": 10, "hash_ids": [1, 2]}\n'
    path = tmp_path / "m.jsonl"
    path.write_text(line * 2 + '{"timestamp": 2, "input_length": 1000, "output_length": 10}\n')
    assert "m.jsonl:3: no hash_ids, but 2 other lines have them" in one_error_line(
        run_cli("sim", "--trace", "mooncake", str(path)))
    assert "error: the path is empty" in one_error_line(run_cli("sim", "--trace", "mooncake", ""))
    path.write_text(line)
    one = run_cli("sim", "--trace", "mooncake", str(path))
    assert one.exit_code == 0, one.stderr
    assert "(1 request)" in one.stdout and "(1 requests)" not in one.stdout


# ---- the declared options: every SimOptions field has exactly one flag, and plan reuses sim's -------------------
OUTPUT_PARAMETERS = {"timeline", "plot", "json_flag", "fmt"}


def _click_options(name: str) -> dict:
    from kvcalc.cli.app import _load_command

    command = _load_command(name, name)
    return {p.name: p for p in command.params if p.name != "help"}


def test_every_sim_options_field_has_exactly_one_flag_and_every_flag_a_field():
    from dataclasses import MISSING, fields

    from kvcalc.core.sim.options import SimOptions

    options = _click_options("sim")
    expected = {}
    for f in fields(SimOptions):
        negate = f.metadata.get("negate", False)
        expected[f"no_{f.name}" if negate else f.name] = (
            f.metadata.get("flag", "--" + f.name.replace("_", "-")), f.metadata.get("short"),
            (not f.default) if negate else f.default)
        assert f.default is not MISSING, f.name
    assert set(options) - OUTPUT_PARAMETERS == set(expected)  # each field once, no flag without a field
    for name, (flag, short, default) in expected.items():
        # the flag core's metadata names (core/plan/space.py writes sim command lines from it), and core's default
        assert options[name].opts[0] == flag and (short is None or short in options[name].opts), name
        assert options[name].default == default, name
    every_flag = [o for p in options.values() for o in (*p.opts, *p.secondary_opts)]
    assert len(every_flag) == len(set(every_flag))


def test_plan_declares_the_sim_options_it_shares_with_sims_own_aliases():
    import typing

    from kvcalc.cli import plan, sim
    from kvcalc.core.sim.options import SimOptions

    sim_hints = typing.get_type_hints(sim.command, include_extras=True)
    plan_hints = typing.get_type_hints(plan.command, include_extras=True)
    shared = {name for name in plan_hints if name in SimOptions.__dataclass_fields__}
    assert {"rate", "trace", "slo", "target_attainment", "model", "seed"} <= shared
    for name in shared - {"gpu", "tp", "max_batched_tokens"}:  # plan's --gpu/--tp/... take lists: its own options
        assert plan_hints[name] is sim_hints[name], name
    sim_options, plan_options = _click_options("sim"), _click_options("plan")
    for name in ("gpu", "tp", "max_batched_tokens"):  # the same flag, another meaning (a list to search)
        assert plan_options[name].opts == sim_options[name].opts


def test_sim_options_of_the_defaults_are_the_dataclass_defaults():
    import inspect

    from kvcalc.cli import sim
    from kvcalc.cli.sim_flags import sim_options
    from kvcalc.core.sim.options import SimOptions

    defaults = {name: p.default for name, p in inspect.signature(sim.command).parameters.items()}
    assert sim_options(defaults) == SimOptions()
    assert sim_options({**defaults, "no_prefix_caching": True, "rate": "4"}) == SimOptions(prefix_caching=False,
                                                                                          rate="4")
