"""`kvcalc size` through the CLI: exit codes, the --json contract, formats and every bad input."""

import json

import pytest

from kvcalc.core.model.models import PRESETS

GIB = 2**30


def test_no_arguments_lists_every_preset(run_cli):
    result = run_cli("size")
    assert result.exit_code == 0, result.stderr
    for spec in PRESETS.values():
        assert spec.name in result.stdout
    assert "800.00 KiB" in result.stdout  # OPT-13B per token at bf16


def test_no_arguments_json_contract(run_cli):
    doc = run_cli("size", "--json").json()
    models = {m["name"]: m for m in doc["models"]}
    assert set(models) == {spec.name for spec in PRESETS.values()}
    assert models["OPT-13B"]["bytes_per_token"] == 819_200 and models["Llama-3-8B"]["bytes_per_token"] == 131_072
    assert doc["dtype"] == "bf16" and doc["bits_per_scalar"] == 16
    # Mistral at 128K holds its 4096-token window: 4096 · 128 KiB = 512 MiB.
    assert models["Mistral-7B-v0.1"]["bytes_per_seq"]["131072"] == 512 * 2**20


def test_no_arguments_with_dtype_and_tokens(run_cli):
    doc = run_cli("size", "--dtype", "int4", "--tokens", "1000", "--json").json()
    llama = next(m for m in doc["models"] if m["name"] == "Llama-3-8B")
    assert llama["bytes_per_token"] == 32_768 and llama["bytes_per_seq"]["1000"] == 32_768_000


def test_model_json_contract(run_cli):
    result = run_cli("size", "--model", "llama-3-8b", "--tokens", "8192", "--seqs", "32", "--memory", "80GiB",
                     "--json")
    assert result.exit_code == 0 and result.stderr == ""
    doc = result.json()
    assert doc["model"] == {**doc["model"], "name": "Llama-3-8B", "layers": 32, "kv_heads": 8, "head_dim": 128,
                            "attention": "gqa", "sliding_window": None}
    assert (doc["dtype"], doc["bits_per_scalar"], doc["bytes_per_token"]) == ("bf16", 16, 131_072)
    assert (doc["tokens"], doc["seqs"], doc["tp"]) == (8192, 32, 1)
    assert doc["bytes_per_seq"] == GIB and doc["total_bytes"] == doc["per_gpu_bytes"] == 32 * GIB
    assert doc["capacity"] == {**doc["capacity"], "memory_bytes": 80 * GIB, "max_tokens": 655_360,
                               "max_seqs": 80, "num_blocks": 40_960}


def test_json_is_one_document(run_cli):
    stdout = run_cli("size", "-m", "gemma-2-9b", "--json").stdout
    assert json.loads(stdout)["model"]["sliding_window"] == 4096
    assert stdout.strip().startswith("{") and stdout.strip().endswith("}")


def test_tp_json(run_cli):
    doc = run_cli("size", "--tp", "8", "--model", "llama-3-70b", "--tokens", "8192", "--json").json()
    # 2 · 80 · 8192 · 8 · 128 · 2 = 2.5 GiB in all; each of 8 GPUs holds 1 head: 320 MiB.
    assert doc["total_bytes"] == 5 * GIB // 2 and doc["per_gpu_bytes"] == 320 * 2**20
    assert doc["kv_heads_per_gpu"] == 1


def test_mla_json_describes_the_latent(run_cli):
    doc = run_cli("size", "-m", "deepseek-v3", "--tokens", "1000", "--tp", "8", "--json").json()
    assert doc["model"]["attention"] == "mla" and doc["model"]["kv_heads"] == 1 and doc["model"]["head_dim"] == 576
    assert doc["bytes_per_seq"] == doc["per_gpu_bytes"] == 61 * 1000 * 576 * 2


def test_human_output_has_formula_and_capacity(run_cli):
    result = run_cli("size", "--model", "llama-3-8b", "--tokens", "8192", "--seqs", "32", "--memory", "80GiB")
    assert result.exit_code == 0
    assert "2 · 32 layers · 8,192 tokens · 8 KV heads · 128 dim · 2 B · 32 seqs = 32.00 GiB" in result.stdout
    assert "34,359,738,368" in result.stdout and "655,360" in result.stdout


def test_tp_budget_is_per_gpu(run_cli):
    result = run_cli("size", "--model", "llama-3-70b", "--tp", "8", "--memory", "80GiB")
    assert "per GPU" in result.stdout and "each GPU holds 1 of the 8 KV heads" in result.stdout


def test_explicit_dims_and_config(run_cli, tmp_path):
    doc = run_cli("size", "--layers", "32", "--kv-heads", "8", "--head-dim", "128", "--tokens", "10", "--json").json()
    assert doc["model"]["name"] == "custom" and doc["bytes_per_seq"] == 10 * 131_072
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 256,
                                  "max_position_embeddings": 100}))
    doc = run_cli("size", "--config", str(config), "--json").json()
    assert doc["tokens"] == 100 and doc["bytes_per_token"] == 2 * 2 * 4 * 64 * 2


@pytest.mark.parametrize("fmt", ["csv", "markdown"])
def test_csv_and_markdown(run_cli, fmt):
    result = run_cli("size", "-m", "falcon-7b", "--tokens", "2048", "--format", fmt)
    # 2048 · 8 KiB: a display string for people (markdown), the exact integer for scripts (csv)
    assert result.exit_code == 0 and ("16,777,216" if fmt == "markdown" else ",16777216,") in result.stdout


def test_huge_inputs_exact(run_cli):
    doc = run_cli("size", "-m", "llama-3-8b", "--tokens", str(10**12), "--seqs", str(10**7), "--json").json()
    assert doc["total_bytes"] == 131_072 * 10**19
    assert "max_position_embeddings" in doc["warnings"][0]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "llama-3"], "unknown model 'llama-3': did you mean Llama-3-8B"),
        (["--model", "llama-3-8b", "--dtype", "fp7"], "--dtype 'fp7' is not a known precision: choose one of"),
        (["--model", "llama-3-8b", "--memory", "80 gigs"], "cannot read the memory size '80 gigs'"),
        (["--model", "llama-3-8b", "--memory", "0"], "must be positive"),
        (["--config", "/nonexistent/config.json"], "/nonexistent/config.json: no such file"),
        (["--model", "llama-3-8b", "--tp", "3"], "--tp 3 does not divide the 8 KV heads"),
        (["--model", "llama-3-8b", "--tp", "12"], "not a multiple of 8"),
        (["--model", "llama-3-8b", "--tp", "0"], "--tp must be a positive number"),
        (["--model", "llama-3-8b", "--tokens", "0"], "--tokens must be a positive integer"),
        (["--model", "llama-3-8b", "--seqs", "-3"], "--seqs must be a positive integer"),
        (["--model", "llama-3-8b", "--block", "0"], "--block must be a positive integer"),
        (["--model", "llama-3-8b", "--tokens", "abc"], "--tokens 'abc' is not an integer"),
        (["--model", "llama-3-8b", "--tokens", "12.5"], "--tokens '12.5' is not an integer"),
        (["--model", "llama-3-8b", "--seqs", "1e-3"], "--seqs '1e-3' is not an integer"),
        (["--model", "llama-3-8b", "--tp", "two"], "--tp 'two' is not an integer"),
        (["--model", "llama-3-8b", "--memory", "80Gb"], "did you mean 80GB (bytes)?"),
        (["--model", "llama-3-8b", "--memory", "80Mb"], "did you mean 80MB (bytes)?"),
        (["--model", "llama-3-8b", "--memory", "1e5000"], "has an exponent beyond"),
        (["--model", "llama-3-8b", "--config", "c.json"], "either --model or --config"),
        (["--layers", "32"], "need --layers, --kv-heads and --head-dim together"),
        (["--layers", "2", "--kv-heads", "2", "--head-dim", "2"], "give --tokens N"),
        (["--memory", "80GiB"], "--memory needs a model"),
        (["--model", "llama-3-8b", "--kv-heads", "5"], "not a multiple of 5 KV heads"),
    ],
)
def test_bad_input_is_one_line_exit_2(run_cli, args, message):
    result = run_cli("size", *args)
    assert result.exit_code == 2, result.stdout
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
    assert message in result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""


def test_bad_config_files(run_cli, tmp_path):
    broken = tmp_path / "config.json"
    broken.write_text("{oops")
    result = run_cli("size", "--config", str(broken))
    assert result.exit_code == 2 and f"{broken}: not valid JSON" in result.stderr
    broken.write_text(json.dumps({"num_attention_heads": 4, "hidden_size": 256}))
    result = run_cli("size", "--config", str(broken))
    assert result.exit_code == 2 and "missing the field 'num_hidden_layers'" in result.stderr


# --- QA fixes: huge numbers, integer spellings, exact half bytes, wording ---------------------------------


def test_huge_memory_formats_without_overflow(run_cli):
    # 1e27 is near the largest --memory read (1024 YiB = 2^90 B; 1e400 is refused as a typo, see test_units)
    result = run_cli("size", "--model", "llama-3-8b", "--memory", "1e27")
    assert result.exit_code == 0, result.stderr
    # 10^27 / 2^80 ≈ 827.18 YiB (10^27 / 1.2089258e24 = 827.18)
    assert "What fits in 827.18 YiB of KV" in result.stdout
    doc = run_cli("size", "--model", "llama-3-8b", "--memory", "1e27", "--json").json()
    assert doc["capacity"]["max_tokens"] == 10**27 // 131_072  # 2 · 32 · 8 · 128 · 2 B per token


def test_huge_total_in_yib(run_cli):
    # 131,072 B · 10^12 tokens · 10^7 seqs = 1.31072e24 B; / 2^80 (1.2089e24) = 1.08 YiB (was 1164153218.27 PiB)
    out = run_cli("size", "-m", "llama-3-8b", "--tokens", "1e12", "--seqs", "1e7").stdout
    assert "│ 1,310,720,000,000,000,000,000,000 │   1.08 YiB │" in out and "1164153218" not in out
    assert "116.42 PiB" in out  # one sequence: 131,072 · 10^12 B / 2^50 = 116.415 PiB


def test_integer_spellings(run_cli):
    doc = run_cli("size", "-m", "llama-3-8b", "--tokens", "1e12", "--seqs", "1_000", "--json").json()
    assert (doc["tokens"], doc["seqs"]) == (10**12, 1000)
    assert doc["total_bytes"] == 131_072 * 10**15  # 131,072 B per token · 10^12 tokens · 10^3 seqs


def _write_config(tmp_path, name, config):
    path = tmp_path / name
    path.write_text(json.dumps(config))
    return str(path)


def test_int4_half_bytes_are_shown_exactly(run_cli, tmp_path):
    # MLA latent 3 + 2 = 5 scalars, 1 layer, int4: 20 bits = 2.5 B per token; 3 tokens: 60 bits = 7.5 B.
    config = _write_config(tmp_path, "mla.json", {
        "num_hidden_layers": 1, "num_attention_heads": 1, "hidden_size": 4, "head_dim": 4,
        "kv_lora_rank": 3, "qk_rope_head_dim": 2})
    result = run_cli("size", "--config", config, "--tokens", "3", "--dtype", "int4")
    rows = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:4]]
            for line in result.stdout.splitlines() if line.startswith("│")}
    assert rows["per token per layer"] == ["2.5", "2.50 B"]
    assert rows["per sequence (3 tokens)"] == ["7.5", "7.50 B"]
    assert rows["per block (16 tokens)"] == ["40", "40 B"]  # 16 · 20 bits = 320 bits, whole
    assert "= 7.50 B" in result.stdout and "rounded up to whole bytes" in " ".join(result.stdout.split())
    doc = run_cli("size", "--config", config, "--tokens", "3", "--dtype", "int4", "--json").json()
    assert (doc["bits_per_token_per_layer"], doc["bits_per_seq"], doc["total_bits"]) == (20, 60, 60)
    assert (doc["bytes_per_token_per_layer"], doc["bytes_per_seq"]) == (3, 8) and doc["bytes_rounded_up"] is True
    assert run_cli("size", "-m", "llama-3-8b", "--json").json()["bytes_rounded_up"] is False


def test_hybrid_config_says_which_layers_keep_kv(run_cli, tmp_path):
    kinds = ["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 3 + ["full_attention"]
    config = _write_config(tmp_path, "hybrid.json", {
        "num_hidden_layers": 8, "num_attention_heads": 4, "num_key_value_heads": 1, "hidden_size": 1024,
        "head_dim": 256, "max_position_embeddings": 4096, "layer_types": kinds})
    out = run_cli("size", "--config", config, "--tokens", "1").stdout
    assert "MQA, 2 of 8 layers keep KV (6 linear attention or state-space), 1 KV head × 256 dim" in out
    # 2 (K, V) · 2 layers · 1 token · 1 head · 256 · 2 B = 2,048 B
    assert "2 · 2 layers · 1 token · 1 KV head · 256 dim · 2 B = 2.00 KiB" in out
    assert "per token (2 layers)" in out and "per sequence (1 token)" in out and "1 KV heads" not in out


def test_sliding_window_capacity_flags_max_tokens_as_a_lower_bound(run_cli):
    mistral = run_cli("size", "-m", "mistral-7b-v0.1", "--memory", "80GiB", "--json").json()["capacity"]
    llama = run_cli("size", "-m", "llama-3-8b", "--memory", "80GiB", "--json").json()["capacity"]
    assert mistral["max_tokens_is_lower_bound"] is True and llama["max_tokens_is_lower_bound"] is False


def test_preset_columns_name_their_token_counts(run_cli):
    header = next(line for line in run_cli("size").stdout.splitlines() if "bytes/token" in line)
    cells = [cell.strip() for cell in header.split("┃")]
    assert cells[-4:-1] == ["4,096 tokens", "32,768 tokens", "131,072 tokens"]  # 4K, 32K, 128K were ambiguous


# --- every architecture: layer groups, recurrent state, configs and the hub cache, the GPU plan ------------------


def test_hybrid_preset_reports_state_and_layer_groups(run_cli):
    doc = run_cli("size", "-m", "nemotron-h-56b", "--tokens", "8192", "--json").json()
    # 10 attention layers · 8,192 tokens · 4,096 B + 54 Mamba-2 layers · 16,900,096 B of state
    assert doc["bytes_per_token"] == 40_960 and doc["state_bytes_per_seq"] == 912_605_184
    assert doc["kv_bytes_per_seq"] == 8192 * 40_960
    assert doc["bytes_per_seq"] == 8192 * 40_960 + 912_605_184
    kinds = {(g["kind"], g["note"]): g["layers"] for g in doc["model"]["layer_groups"]}
    assert kinds == {("full", ""): 10, ("none", "mamba2"): 54, ("none", "MLP only"): 54}
    out = run_cli("size", "-m", "nemotron-h-56b", "--tokens", "8192").stdout
    assert "Layers of Nemotron-H-56B" in out and "mamba2 state (conv bf16, ssm fp32)" in out
    assert "10 of 118 layers keep KV (54 mamba2, 54 MLP only)" in out


def test_capacity_includes_the_state(run_cli):
    doc = run_cli("size", "-m", "nemotron-h-56b", "--tokens", "8192", "--memory", "80GiB", "--json").json()
    assert doc["capacity"]["max_seqs"] == 80 * GIB // (8192 * 40_960 + 912_605_184)


def test_config_folder_and_hub_model(run_cli, tmp_path, monkeypatch):
    config = {"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 256, "max_position_embeddings": 100}
    folder = tmp_path / "Tiny-Model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    doc = run_cli("size", "--config", str(folder), "--json").json()
    assert doc["model"]["name"] == "Tiny-Model" and doc["bytes_per_token"] == 2 * 2 * 4 * 64 * 2
    snapshot = tmp_path / "hub" / "models--acme--Tiny" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps(config))
    (tmp_path / "hub" / "models--acme--Tiny" / "refs").mkdir()
    (tmp_path / "hub" / "models--acme--Tiny" / "refs" / "main").write_text("abc123")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    doc = run_cli("size", "--model", "acme/Tiny", "--json").json()
    assert doc["model"]["name"] == "acme/Tiny" and doc["tokens"] == 100
    missing = run_cli("size", "--model", "acme/Other")
    assert missing.exit_code == 2 and "models--acme--Other" in missing.stderr and "hf download" in missing.stderr


def test_config_without_a_context_length(run_cli, tmp_path):
    falcon = {"model_type": "falcon", "hidden_size": 4544, "num_attention_heads": 71, "num_hidden_layers": 32,
              "multi_query": True, "new_decoder_architecture": False, "vocab_size": 65024}
    folder = tmp_path / "falcon-7b"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(falcon))
    result = run_cli("size", "--config", str(folder))
    assert result.exit_code == 0, result.stderr
    assert "names no context length" in " ".join(result.stdout.split())
    assert "per sequence of 32,768 tokens" in result.stdout
    doc = run_cli("size", "--config", str(folder), "--json").json()
    # 2 · 32 layers · 1 KV head · 64 · 2 B = 8,192 B per token; 32,768 tokens: 256 MiB
    assert doc["tokens"] is None and doc["bytes_per_token"] == 8192 and doc["bytes_per_token_per_layer"] == 256
    assert doc["bytes_per_block"] == 16 * 8192 and doc["bytes_per_seq"]["32768"] == 32768 * 8192
    assert doc["model"]["name"] == "falcon-7b"
    refused = run_cli("size", "--config", str(folder), "--seqs", "4")
    assert refused.exit_code == 2 and "give --tokens N" in refused.stderr


def test_gpu_plan_json_and_table(run_cli):
    doc = run_cli("size", "-m", "llama-3-8b", "--gpu", "H100-SXM", "--json").json()
    plan = doc["gpu_plan"]
    assert set(plan) >= {"kv_cache_bytes", "num_blocks", "kv_cache_tokens", "max_concurrency", "estimates"}
    assert plan["num_blocks"] == plan["kv_cache_bytes"] // (16 * 131_072)
    assert plan["kv_cache_tokens"] == plan["num_blocks"] * 16  # 8,192 is a multiple of 16
    out = run_cli("size", "-m", "llama-3-8b", "--gpu", "h100-sxm").stdout
    assert "GPU KV cache size (tokens)" in out and "activation peak (estimate)" in out


def test_kv_memory_reproduces_a_log_line(run_cli):
    # 24 layers · 2 · 1 KV head · 128 · 2 B = 12,288 B per token; 190,100 blocks of 16 -> 92.82x at 32,768
    args = ("size", "--layers", "24", "--kv-heads", "1", "--head-dim", "128", "--tokens", "32768",
            "--max-model-len", "32768", "--kv-memory", str(190_100 * 16 * 12_288))
    plan = run_cli(*args, "--json").json()["gpu_plan"]
    assert (plan["num_blocks"], round(plan["max_concurrency"], 2)) == (190_100, 92.82)
    assert plan["log_lines"][0] == "Available KV cache memory: 34.81 GiB"


@pytest.mark.parametrize(("args", "message"), [
    (["-m", "llama-3-8b", "--gpu-memory-utilization", "0.8"], "applies to the GPU plan: add --gpu NAME"),
    (["-m", "llama-3-8b", "--gpu", "B900"], "unknown GPU 'B900'"),
    (["--gpu", "H200"], "--gpu needs a model"),
    (["-m", "llama-3-8b", "--gpu", "H200", "--gpu-memory-utilization", "2"], "--gpu-memory-utilization must be in"),
    (["-m", "llama-3-70b", "--gpu", "A100-40GB"], "leave no KV memory"),
])
def test_gpu_plan_bad_input(run_cli, args, message):
    result = run_cli("size", *args)
    assert result.exit_code == 2 and message in result.stderr and result.stderr.count("\n") == 1


def test_kv_memory_as_vllm_logs_it(run_cli):
    # vLLM prints two decimals of GiB: 34.81 · 2^30 = 37,376,952,893.44 B, not whole bytes (was refused although
    # the --help example); the whole bytes below it are used and the note says so
    result = run_cli("size", "-m", "llama-3-8b", "--kv-memory", "34.81GiB", "--max-model-len", "32768", "--json")
    assert result.exit_code == 0 and result.json()["gpu_plan"]["kv_cache_bytes"] == 37_376_952_893
    table = run_cli("size", "-m", "llama-3-8b", "--kv-memory", "34.81GiB", "--max-model-len", "32768")
    assert "34.81GiB is 37,376,952,893.44 bytes: 37,376,952,893 whole bytes are used" in table.stdout
    assert "give --kv-memory" not in table.stdout  # it was given


@pytest.mark.parametrize(("args", "message"), [
    (["--memory", ""], "error: --memory: cannot read the memory size ''"),
    (["--memory", "0"], "error: --memory: the memory size '0' must be positive"),
    (["--gpu", "H200", "--kv-memory", "lots"], "error: --kv-memory: cannot read the memory size 'lots'"),
    (["--kv-memory", "0.1"], "error: --kv-memory: the memory size '0.1' is less than one byte"),
    (["--gpu", "H200", "--weight-dtype", ""], "error: --weight-dtype '' is not a known precision"),  # named --dtype
    (["--gpu", "H200", "--gpu-memory-utilization", ""], "error: --gpu-memory-utilization '' is not a number: write "
                                                       "e.g. --gpu-memory-utilization 0.9"),  # typer's gave no fix
    (["--gpu", "H200", "--gpu-memory-utilization", "nan"], "error: --gpu-memory-utilization must be in (0, 1]"),
])
def test_size_options_are_named_in_their_errors(run_cli, args, message):
    result = run_cli("size", "-m", "llama-3-8b", *args)
    assert result.exit_code == 2 and result.stderr.startswith(message) and result.stderr.count("\n") == 1


def test_config_from_standard_input():
    from typer.testing import CliRunner

    from kvcalc.cli.app import app

    config = {"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
              "num_hidden_layers": 32, "max_position_embeddings": 8192}
    result = CliRunner().invoke(app, ["size", "--config", "-", "--json"], input=json.dumps(config))
    assert result.exit_code == 0 and json.loads(result.stdout)["bytes_per_token"] == 32 * 2 * 8 * 128 * 2


@pytest.mark.parametrize(("args", "message"), [
    (["-m", "llama-3-8b", "--gpu", "H100-SXM", "--block", "3"], "error: --block 3: vLLM's start-up figures need a "
                                                                  "block size vLLM accepts"),
    (["-m", "llama-3-8b", "--seqs", "1e400"], "error: --seqs 1.000e+400 is above 2**63-1"),
    (["-m", "llama-3-8b", "--block", "1e400"], "error: --block 1.000e+400 is above 2**63-1"),
    (["-m", "llama-3-8b", "--gpu", "H100-SXM", "--max-model-len", "1e400"], "error: --max-model-len 1.000e+400 is "
                                                                              "above 2**63-1"),
    (["-m", "llama-3-8b", "--tp", "1000000"], "error: --tp 1000000 is above its limit of 1,024 GPUs"),
    (["-m", "llama-3-8b", "--gpu", "H100-SXM", "--tp", "3"], "error: --tp 3 does not divide the 8 KV heads"),
    (["-m", "llama-3-8b", "--gpu", "H100-SXM", "--vllm-version", "0.5"], "is not modelled"),
])
def test_also_found_refusals(run_cli, args, message):
    result = run_cli("size", *args)
    assert result.exit_code == 2 and message in result.stderr and "Traceback" not in result.stderr


def test_block_3_accounting_still_works(run_cli):
    doc = run_cli("size", "-m", "llama-3-8b", "--block", "3", "--json").json()
    assert doc["bytes_per_block"] == 3 * 131_072


def test_version_and_pipeline_in_the_output(run_cli):
    plan = run_cli("size", "-m", "llama-3.1-8b", "--gpu", "H100-SXM", "--max-model-len", "8192", "--pp", "2",
                   "--vllm-version", "0.19", "--gpu-memory-utilization", "0.95", "--json").json()["gpu_plan"]
    assert plan["vllm_version"] == "0.19" and plan["pp"] == 2 and len(plan["stages"]) == 2
    # the last stage holds the LM head and samples: it has the least KV memory and sets the blocks
    assert plan["kv_cache_bytes"] == min(s["kv_cache_bytes"] for s in plan["stages"])
    assert plan["num_blocks"] == plan["kv_cache_bytes"] // (16 * 16 * 4096)  # 16 layers' 4 KiB pages of 16 tokens
    table = run_cli("size", "-m", "llama-3.1-8b", "--gpu", "B200", "--max-model-len", "8192").stdout
    assert "vLLM 0.21 start-up figures on B200" in table and "0.92 utilization" in table


def test_gpu_plan_reads_vision_tower_and_quantization_from_the_config(run_cli, tmp_path):
    import json

    text = {"model_type": "llama", "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
            "hidden_size": 4096, "intermediate_size": 14336, "vocab_size": 128256, "max_position_embeddings": 8192,
            "torch_dtype": "bfloat16"}
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "config.json").write_text(json.dumps(text))
    vision = {"hidden_size": 1152, "intermediate_size": 4304, "num_hidden_layers": 27, "patch_size": 14,
              "image_size": 384, "hidden_act": "gelu_pytorch_tanh"}
    (tmp_path / "vl").mkdir()
    (tmp_path / "vl" / "config.json").write_text(json.dumps({**text, "vision_config": vision}))
    quant = {"quant_method": "compressed-tensors",
             "config_groups": {"g": {"weights": {"num_bits": 8, "type": "int"}, "targets": ["Linear"]}}}
    (tmp_path / "q").mkdir()
    (tmp_path / "q" / "config.json").write_text(json.dumps({**text, "quantization_config": quant}))

    def plan(name):
        return run_cli("size", "--config", str(tmp_path / name), "--gpu", "H100-SXM", "--json").json()["gpu_plan"]

    plain, vl, q = plan("plain"), plan("vl"), plan("q")
    # the SigLIP tower, 412,987,248 parameters (tests/core/model/test_vllm_startup.py), and a projector into
    # the 4,096-wide text model 1152 · 4096 + 4096², at bf16
    assert vl["weights_bytes"] - plain["weights_bytes"] == (412_987_248 + 1152 * 4096 + 4096 * 4096) * 2
    assert any("vision tower" in e for e in vl["estimates"])
    # int8 linear layers: the body (all but the two 128,256 x 4,096 tables) takes half the bytes
    body = (plain["weights_bytes"] - 2 * 128_256 * 4096 * 2 - 8192 * 128 * 2) // 2
    assert plain["weights_bytes"] - q["weights_bytes"] == body


def test_gpu_plan_holds_for_hybrids(run_cli):
    # Nemotron-H (Mamba-2 + attention): the memory model and the grown attention block; pipeline stages of a
    # preset with several KV-cache groups are refused rather than guessed (a preset does not record which layer
    # is which; from a config.json they are planned: test_pipeline_stages_of_a_hybrid)
    plan = run_cli("size", "-m", "Nemotron-H-56B", "--gpu", "H100-SXM", "--tp", "8", "--json").json()["gpu_plan"]
    assert plan["block_size"] == 4128 and plan["kv_cache_bytes"] > 0 and plan["vllm_version"] == "0.21"
    result = run_cli("size", "-m", "Nemotron-H-56B", "--gpu", "H100-SXM", "--tp", "8", "--pp", "2")
    assert result.exit_code == 2 and "several KV-cache groups" in result.stderr
    refused = run_cli("size", "-m", "Gemma-3-27B", "--gpu", "H200", "--block", "24")
    assert refused.exit_code == 2 and "--block 24" in refused.stderr


def test_pipeline_stages_with_the_kv_memory_given(run_cli):
    # 10 GiB on a GPU of one of 2 stages: 16 of Llama-3-8B's 32 layers, 64 KiB per token: 163,840 tokens
    plan = run_cli("size", "-m", "llama-3-8b", "--kv-memory", "10GiB", "--pp", "2", "--max-model-len", "8192",
                   "--json").json()["gpu_plan"]
    assert plan["kv_cache_tokens"] == 10 * 2**30 // (16 * 4096)
    result = run_cli("size", "-m", "llama-3-8b", "--gpu", "H100-SXM", "--max-num-seqs", "0")
    assert result.exit_code == 2 and "--max-num-seqs must be a positive integer" in result.stderr


def test_gpu_plan_on_a_pure_recurrent_model(run_cli, tmp_path):
    """Mamba-Codestral (no attention): vLLM serves it with one state page per layer per sequence; 10 GiB holds
    10 GiB // (64 · 2,158,592 B) = 77 sequences, "GPU KV cache size" 77 · 4,096 tokens."""
    from tests.core.model.test_architecture_configs import MAMBA_CODESTRAL, RWKV4_169M

    (tmp_path / "config.json").write_text(json.dumps(MAMBA_CODESTRAL))
    result = run_cli("size", "--config", str(tmp_path), "--kv-memory", "10GiB", "--max-model-len", "4096", "--json")
    assert result.exit_code == 0, result.stderr
    plan = result.json()["gpu_plan"]
    assert (plan["num_blocks"], plan["kv_cache_tokens"], plan["max_concurrency"]) == (77, 315_392, 77.0)
    assert plan["block_size"] == 4096 and plan["groups"] == [
        {"kind": "mamba2", "layers": 64, "block_size": None, "blocks_per_request": 1}]
    table = run_cli("size", "--config", str(tmp_path), "--gpu", "H100-SXM", "--max-model-len", "4096")
    assert table.exit_code == 0 and "attention-free: one mamba2 state page of 2,158,592 B per layer" in table.stdout
    (tmp_path / "rwkv").mkdir()
    (tmp_path / "rwkv" / "config.json").write_text(json.dumps(RWKV4_169M))
    refused = run_cli("size", "--config", str(tmp_path / "rwkv"), "--gpu", "H100-SXM")
    assert refused.exit_code == 2 and refused.stderr.count("\n") == 1
    assert refused.stderr.startswith("error: ") and "RWKV-4 is not among vLLM's models" in refused.stderr


def test_pipeline_stages_of_a_hybrid(run_cli, tmp_path):
    """Gemma-2-9B from its config.json at --pp 2: each stage pages 11 of the 21 slots (11 sliding + 10 full layers
    on stage 0, 10 + 11 on stage 1): 10 GiB // (11 · 131,072 B) = 7,447 blocks; a preset, whose layer order is not
    recorded, is refused naming --pp."""
    from tests.core.model.test_hf_config import GEMMA_2_9B

    (tmp_path / "config.json").write_text(json.dumps(GEMMA_2_9B))
    result = run_cli("size", "--config", str(tmp_path), "--kv-memory", "10GiB", "--pp", "2", "--json")
    assert result.exit_code == 0, result.stderr
    plan = result.json()["gpu_plan"]
    assert (plan["stage_slots"], plan["num_blocks"], plan["group_size"]) == (11, 7447, 21)
    table = run_cli("size", "--config", str(tmp_path), "--kv-memory", "10GiB", "--pp", "2").stdout
    assert "a block id pages 11 layer slots of 128.00 KiB (of the model's 21)" in table
    refused = run_cli("size", "-m", "gemma-2-9b", "--gpu", "H100-SXM", "--pp", "2")
    assert refused.exit_code == 2 and refused.stderr.count("\n") == 1
    assert refused.stderr.startswith("error: --pp 2:") and "give its config.json (--config)" in refused.stderr
