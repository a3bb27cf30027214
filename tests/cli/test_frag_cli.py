"""`kvcalc frag` through the CLI: the worked example, the JSON contract, every source and every bad input."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

FRAG_KEYS = {"lengths", "fixed", "paged"}
LENGTHS_KEYS = {"count", "total", "min", "max", "mean", "source"}
FIXED_KEYS = {"max_len", "allocated", "waste", "utilization"}
PAGED_KEYS = {
    "block_size", "blocks", "allocated", "waste", "utilization", "block_table_bytes_exact", "block_table_bytes_dense",
}
LLAMA3_8B_BYTES_PER_TOKEN = 131072  # 32 layers · 2 · 8 KV heads · 128 · 2 B (fp16) = 128 KiB


def _assert_contract(doc: dict) -> None:
    assert doc.keys() >= FRAG_KEYS
    assert doc["lengths"].keys() >= LENGTHS_KEYS
    assert doc["fixed"].keys() >= FIXED_KEYS
    assert doc["paged"] and all(entry.keys() >= PAGED_KEYS for entry in doc["paged"])
    assert 0 < doc["fixed"]["utilization"] <= 1
    assert all(0 < entry["utilization"] <= 1 for entry in doc["paged"])


def _assert_bad_input(result, *fragments: str) -> None:
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    for fragment in fragments:
        assert fragment in result.stderr, (fragment, result.stderr)


def test_no_arguments_is_the_worked_example(run_cli):
    result = run_cli("frag")
    assert result.exit_code == 0, result.stderr
    for figure in ("968", "2,560", "992", "1,024", "37.81 %", "97.58 %", "94.53 %", "constructed"):
        assert figure in result.stdout, figure
    assert "Per sequence" in result.stdout  # 5 lengths <= 50: rows are shown


def test_worked_example_json(run_cli):
    doc = run_cli("frag", "--json").json()
    _assert_contract(doc)
    lengths = doc["lengths"]
    assert [lengths[k] for k in ("count", "total", "min", "max", "mean")] == [5, 968, 37, 511, 193.6]
    assert doc["lengths"]["source"].startswith("constructed: ")
    assert [doc["fixed"][k] for k in ("max_len", "allocated", "waste")] == [512, 2560, 1592]
    assert doc["fixed"]["utilization"] == pytest.approx(968 / 2560)
    b16, b32 = doc["paged"]
    assert (b16["block_size"], b16["blocks"], b16["allocated"], b16["waste"]) == (16, 62, 992, 24)
    assert (b32["block_size"], b32["blocks"], b32["allocated"], b32["waste"]) == (32, 32, 1024, 56)
    assert b16["utilization"] == pytest.approx(968 / 992)  # a fraction, not a percentage
    assert (b16["block_table_bytes_exact"], b16["block_table_bytes_dense"]) == (248, 640)
    assert [row["n"] for row in doc["per_seq"]] == [37, 91, 128, 201, 511]
    assert doc["per_seq"][0] == {
        "n": 37, "reservation_waste": 475, "allocated_b16": 48, "waste_b16": 11, "allocated_b32": 64, "waste_b32": 27
    }


def test_block_16_only(run_cli):
    doc = run_cli("frag", "--block", "16", "--json").json()
    assert [p["block_size"] for p in doc["paged"]] == [16]
    assert doc["lengths"]["total"] == 968 and doc["paged"][0]["allocated"] == 992


def test_sweep_sizes_chart_and_extra_block(run_cli):
    result = run_cli("frag", "--sweep", "--block", "48")
    assert result.exit_code == 0, result.stderr
    assert "Tail-block waste vs block size" in result.stdout and "█" in result.stdout
    doc = run_cli("frag", "--sweep", "--block", "48", "--json").json()
    assert [p["block_size"] for p in doc["paged"]] == [1, 2, 4, 8, 16, 32, 48, 64, 128, 256]
    assert doc["paged"][0]["waste"] == 0  # B = 1 never wastes


def test_csv_and_markdown_formats(run_cli):
    csv_out = run_cli("frag", "--format", "csv").stdout
    assert "scheme,max_len,block_size,blocks,useful,allocated,waste,utilization," in csv_out
    assert "paged,,16,62,968,992,24,0.9758064516129032,248,640" in csv_out  # 968/992; 62 int32 ids = 248 B
    assert "%" not in csv_out and "—" not in csv_out
    markdown = run_cli("frag", "--format", "markdown").stdout
    assert "### Fixed reservation vs paging" in markdown and "| paged, B = 16" in markdown


def test_per_seq_rows_only_up_to_50_lengths_unless_asked(run_cli):
    fifty_one = ",".join(["7"] * 51)
    assert "per_seq" not in run_cli("frag", "--lengths", fifty_one, "--json").json()
    doc = run_cli("frag", "--lengths", fifty_one, "--per-seq", "--json").json()
    assert len(doc["per_seq"]) == 51


def test_max_len_option(run_cli):
    doc = run_cli("frag", "--max-len", "1024", "--json").json()
    assert doc["fixed"]["allocated"] == 5 * 1024
    assert doc["paged"][0]["block_table_bytes_dense"] == 5 * 64 * 4  # ceil(1024/16) = 64 entries each


def test_constructed_sample_is_reproducible_and_labelled(run_cli):
    args = ("frag", "--dist", "lognormal:mean=500,sigma=0.5", "--count", "2000", "--seed", "3", "--json")
    first, second = run_cli(*args).json(), run_cli(*args).json()
    assert first == second
    assert first["lengths"]["count"] == 2000
    assert first["lengths"]["source"] == "constructed: 2,000 samples of lognormal(mean=500, sigma=0.5), seed 3"
    other = run_cli("frag", "--dist", "lognormal:mean=500,sigma=0.5", "--count", "2000", "--seed", "4", "--json")
    assert other.json()["lengths"]["total"] != first["lengths"]["total"]


def test_lengths_file_sources(run_cli, tmp_path):
    lines = tmp_path / "lengths.txt"
    lines.write_text("37\n91\n128\n201\n511\n")
    doc = run_cli("frag", "--lengths-file", str(lines), "--json").json()
    assert doc["lengths"]["total"] == 968 and doc["lengths"]["source"].startswith("user: lengths file")
    table = tmp_path / "t.csv"
    table.write_text("id,n\na,37\nb,91\n")
    assert run_cli("frag", "--lengths-file", str(table), "--column", "n", "--json").json()["lengths"]["total"] == 128
    as_json = tmp_path / "l.json"
    as_json.write_text("[37, 91]")
    assert run_cli("frag", "--lengths-file", str(as_json), "--json").json()["lengths"]["total"] == 128
    as_npy = tmp_path / "l.npy"
    np.save(as_npy, np.array([37, 91]))
    assert run_cli("frag", "--lengths-file", str(as_npy), "--json").json()["lengths"]["total"] == 128


def test_real_traces_say_real(run_cli, tmp_path):
    azure = tmp_path / "azure.csv"
    azure.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,374,44\n2023-11-16 18:15:50.99,396,109\n"
    )
    result = run_cli("frag", "--trace", "azure", str(azure))
    assert result.exit_code == 0 and "real: azure trace" in result.stdout
    doc = run_cli("frag", "--trace", "azure", str(azure), "--json").json()
    assert doc["lengths"]["total"] == 374 + 44 + 396 + 109 and doc["lengths"]["kind"] == "real"
    prompt = run_cli("frag", "--trace", "azure", str(azure), "--phase", "prompt", "--json").json()
    assert prompt["lengths"]["total"] == 374 + 396
    mooncake = tmp_path / "m.jsonl"
    mooncake.write_text(json.dumps({"timestamp": 0, "input_length": 700, "output_length": 20, "hash_ids": [0, 1]}))
    doc = run_cli("frag", "--trace", "mooncake", str(mooncake), "--json").json()
    assert doc["lengths"]["total"] == 720 and doc["lengths"]["source"].startswith("real: mooncake trace")


def test_model_adds_bytes(run_cli):
    result = run_cli("frag", "--model", "llama-3-8b", "--dtype", "fp16")
    assert result.exit_code == 0 and "KV bytes — Llama-3-8B, fp16 (128.00 KiB per token)" in result.stdout
    doc = run_cli("frag", "--model", "llama-3-8b", "--json").json()
    _assert_contract(doc)
    assert doc["model"]["bytes_per_token"] == LLAMA3_8B_BYTES_PER_TOKEN
    assert doc["fixed"]["useful_kv_bytes"] == 968 * LLAMA3_8B_BYTES_PER_TOKEN
    assert doc["fixed"]["reservation_waste_bytes"] == 1592 * LLAMA3_8B_BYTES_PER_TOKEN
    b16 = doc["paged"][0]
    assert b16["allocated_kv_bytes"] == 992 * LLAMA3_8B_BYTES_PER_TOKEN
    assert b16["fragmentation_bytes"] == 24 * LLAMA3_8B_BYTES_PER_TOKEN
    assert b16["block_table_bytes_exact"] == 248
    int8 = run_cli("frag", "--model", "llama-3-8b", "--dtype", "int8", "--json").json()
    assert int8["paged"][0]["allocated_kv_bytes"] == 992 * LLAMA3_8B_BYTES_PER_TOKEN // 2


def test_explicit_dimensions(run_cli):
    doc = run_cli("frag", "--layers", "2", "--kv-heads", "1", "--head-dim", "4", "--dtype", "fp32", "--json").json()
    assert doc["model"]["bytes_per_token"] == 2 * 2 * 1 * 4 * 4  # layers · K,V · heads · d · 4 B
    assert doc["paged"][0]["useful_kv_bytes"] == 968 * 64


def test_plot_writes_a_figure(run_cli, tmp_path):
    pytest.importorskip("matplotlib", reason="the plot extra is not installed")
    target = tmp_path / "waste.svg"
    result = run_cli("frag", "--sweep", "--plot", str(target))
    assert result.exit_code == 0, result.stderr
    assert target.read_text().lstrip().startswith("<?xml") and f"wrote {target}" in result.stderr


def test_plot_without_matplotlib_says_how_to_install(run_cli, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` raise ImportError
    _assert_bad_input(run_cli("frag", "--plot", str(tmp_path / "w.png")), "pip install 'kvcalc[plot]'")


def _file(tmp_path, name: str, content: str) -> str:
    path = tmp_path / name
    path.write_text(content)
    return str(path)


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (("--lengths", "37,0,5"), ("item 2", "length 0")),
        (("--lengths", "37,-3"), ("item 2", "length -3")),
        (("--lengths", "37,4.5"), ("item 2", "'4.5' is not an integer")),
        (("--block", "0"), ("--block 0",)),
        (("--block", "-16"), ("--block -16",)),
        (("--max-len", "256"), ("length 511", "above --max-len 256")),
        (("--max-len", "0"), ("--max-len 0",)),
        (("--dist", "gamma:mean=3"), ("unknown distribution 'gamma'",)),
        (("--dist", "lognormal:mean=3,shape=1"), ("unknown parameter 'shape=1'",)),
        (("--dist", "zipf:a=1.5"), ("zipf needs max",)),
        (("--dist", "uniform:high=10", "--count", "0"), ("--count must be a positive",)),
        (("--lengths", "1,2", "--dist", "uniform:high=3"), ("give one source of lengths",)),
        (("--column", "n"), ("--column applies only to --lengths-file",)),
        (("--count", "5"), ("--count applies only to --dist",)),
        (("--seed", "5"), ("--seed applies only to --dist",)),
        (("--phase", "prompt"), ("--phase applies only to --trace",)),
        (("--dtype", "fp8"), ("--dtype applies to KV bytes",)),
        (("--model", "llama-9"), ("unknown model 'llama-9'",)),
        (("--model", "llama-3-8b", "--dtype", "fp7"), ("--dtype 'fp7' is not a known precision",)),
        (("--model", "llama-3-8b", "--dtype", ""), ("--dtype '' is not a known precision",)),  # was the default
        (("--trace", "azure", "/nonexistent/azure.csv", "--phase", ""), ("unknown --phase ''",)),
        (("--plot", "waste.txt"), (".png or .svg",)),
        (("--block", "x"), ("--block",)),
        (("--lengths-file", "/nonexistent/lengths.txt"), ("/nonexistent/lengths.txt", "no such file")),
        (("--trace", "azure", "/nonexistent/azure.csv"), ("/nonexistent/azure.csv", "no such file")),
        (("--trace", "sharegpt", "/nonexistent/x.csv"), ("unknown trace kind 'sharegpt'",)),
    ],
)
def test_bad_input(run_cli, args, fragments):
    _assert_bad_input(run_cli("frag", *args), *fragments)


def test_bad_files(run_cli, tmp_path):
    _assert_bad_input(run_cli("frag", "--lengths-file", _file(tmp_path, "empty.txt", "")), "is empty")
    _assert_bad_input(
        run_cli("frag", "--lengths-file", _file(tmp_path, "bad.txt", "37\n91\nninety\n")), "bad.txt:3", "'ninety'"
    )
    _assert_bad_input(run_cli("frag", "--lengths-file", _file(tmp_path, "zero.txt", "5\n0\n")), "zero.txt:2")
    csv_path = _file(tmp_path, "req.csv", "id,prompt,output\n1,2,3\n")
    _assert_bad_input(
        run_cli("frag", "--lengths-file", csv_path, "--column", "tokens"), "no column 'tokens'", "id, prompt, output"
    )
    _assert_bad_input(run_cli("frag", "--trace", "azure", _file(tmp_path, "a.csv", "")), "is empty")


def test_huge_lengths_stay_exact(run_cli):
    big = 2**62  # two of them sum to 2^63, one more than int64 holds
    doc = run_cli("frag", "--lengths", f"{big},{big},3", "--block", "1", "--block", "1000", "--model", "llama-3-8b",
                  "--json").json()
    assert doc["lengths"]["total"] == 2**63 + 3
    assert doc["fixed"]["max_len"] == 2**62 and doc["fixed"]["allocated"] == 3 * 2**62
    b1, b1000 = doc["paged"]
    assert b1["allocated"] == 2**63 + 3 and b1["waste"] == 0
    assert b1000["blocks"] == 2 * -(-big // 1000) + 1  # ceil(2^62/1000) twice, plus one block for 3 tokens
    assert b1["useful_kv_bytes"] == (2**63 + 3) * LLAMA3_8B_BYTES_PER_TOKEN


def test_terminal_bars_by_hand():
    from kvcalc.cli.chart import bar, bar_chart

    assert bar(8, 8, 5) == "█████"  # the largest value fills the width
    assert bar(1, 8, 4) == "▌"  # 1/8 of 4 cells = half a cell
    assert bar(3, 8, 4) == "█▌"  # 3/8 of 4 cells = 1.5 cells
    assert bar(1, 10**6, 40) == "▏"  # a non-zero value always shows
    assert bar(0, 8, 4) == ""
    chart = bar_chart("t", ["B = 1", "B = 16"], [0, 10], ["0", "10"], width=4)
    assert chart.splitlines() == ["t", " B = 1 │     0", "B = 16 │████ 10"]


def test_config_json_model(run_cli, tmp_path):
    config = _file(tmp_path, "config.json", json.dumps({
        "model_type": "llama", "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "hidden_size": 64, "max_position_embeddings": 4096,
    }))
    doc = run_cli("frag", "--config", config, "--json").json()
    assert doc["model"]["bytes_per_token"] == 2 * 2 * 2 * 16 * 2  # layers · K,V · KV heads · (64 / 4) · 2 B
    assert doc["paged"][0]["useful_kv_bytes"] == 968 * 256


def test_two_kv_cache_groups_double_the_block_tables_everywhere(run_cli):
    # Gemma-2-9B mixes full and sliding-window layers: one block table per KV-cache group, so B = 16 holds
    # 2 × 62 int32 ids = 496 B (exact) and 2 × 5 × ceil(512/16) × 4 = 1,280 B (dense) — in the JSON, the
    # table and its CSV alike.
    doc = run_cli("frag", "--model", "gemma-2-9b", "--json").json()
    assert doc["model"]["kv_cache_groups"] == 2
    b16 = doc["paged"][0]
    assert (b16["block_table_bytes_exact"], b16["block_table_bytes_dense"]) == (496, 1280)
    csv_lines = run_cli("frag", "--model", "gemma-2-9b", "--format", "csv").stdout.splitlines()
    header = csv_lines[1].split(",")
    row = dict(zip(header, csv_lines[3].split(","), strict=True))
    assert row["block_size"] == "16" and (row["block_table_bytes_exact"], row["block_table_bytes_dense"]) == (
        "496", "1280")
    assert "496 B" in run_cli("frag", "--model", "gemma-2-9b").stdout.split("KV bytes")[0]


# --- error texts, large per-sequence output, wording ----------------------------------------------------


def test_binary_lengths_file_names_the_file(run_cli, tmp_path):
    path = tmp_path / "bin.txt"
    path.write_bytes(b"\xff\xd8\xff\xe0 not text")
    _assert_bad_input(run_cli("frag", "--lengths-file", str(path)), f"{path}: not a text file (not UTF-8)")


def test_plot_into_a_missing_directory_says_so(run_cli, tmp_path):
    target = tmp_path / "nonexist" / "x.png"
    _assert_bad_input(run_cli("frag", "--plot", str(target)), f"the directory {target.parent} does not exist")


def test_integer_options_accept_exact_scientific_spellings(run_cli):
    # 1.6e1 = 16, 5.12e2 = 512: the worked example (Σ A_16 = 992, fixed 5 · 512 = 2,560)
    doc = run_cli("frag", "--block", "1.6e1", "--max-len", "5.12e2", "--json").json()
    assert (doc["paged"][0]["allocated"], doc["fixed"]["allocated"]) == (992, 2560)
    _assert_bad_input(run_cli("frag", "--block", "16.5"), "--block '16.5' is not an integer")


def test_per_seq_table_is_refused_above_10000_rows(run_cli):
    args = ("frag", "--dist", "uniform:low=1,high=64", "--count", "10001", "--per-seq")
    _assert_bad_input(run_cli(*args), "--per-seq with 10,001 lengths", "at most 10,000 rows", "--json")
    _assert_bad_input(run_cli(*args, "--format", "markdown"), "at most 10,000 rows")
    doc = run_cli(*args, "--json").json()
    assert len(doc["per_seq"]) == 10_001
    row = doc["per_seq"][0]  # A_16(n) = 16 · ceil(n / 16), W = A − n, M − n with M = 64 (next power of two >= 64)
    n = row["n"]
    a16, a32 = -(-n // 16) * 16, -(-n // 32) * 32
    assert row == {"n": n, "reservation_waste": 64 - n, "allocated_b16": a16, "waste_b16": a16 - n,
                   "allocated_b32": a32, "waste_b32": a32 - n}
    csv_lines = run_cli(*args, "--format", "csv").stdout.splitlines()
    per_seq_at = csv_lines.index("# Per sequence (token positions)")
    assert csv_lines[per_seq_at + 1] == "seq,n,reservation_waste,allocated_b16,waste_b16,allocated_b32,waste_b32"
    assert csv_lines[per_seq_at + 2] == ",".join(str(v) for v in (1, *row.values()))
    assert len(csv_lines) - per_seq_at - 2 == 10_001


def test_one_length_is_singular(run_cli):
    out = run_cli("frag", "--lengths", "5").stdout
    assert "1 sequence, 5 tokens;" in out and "1 sequences" not in out


def test_sliding_window_model_notes_which_table_applies_the_window(run_cli):
    out = run_cli("frag", "--model", "mistral-7b-v0.1", "--lengths", "5000").stdout
    assert "The token-position table (and the per-sequence rows) ignore windows" in " ".join(out.split())
    assert "ignore windows" not in run_cli("frag", "--model", "llama-3-8b", "--lengths", "5000").stdout


# --- hybrid models: KV cache groups, the state, the layouts (issue 19) ---------------------------------------


def test_gemma3_groups_vllm_against_ideal(run_cli):
    # Gemma-3-27B, one sequence of 5,000 tokens, B = 16, bf16: 8,192 B per token per layer.
    # full: 10 layers · ceil(5000/16) = 313 blocks · 16 tokens = 5,008 positions -> 10 · 5,008 · 8,192 B
    # sliding (W 1024): blocks ceil(5000/16) − floor((5000 − 1024)/16) = 313 − 248 = 65 per table;
    #   vllm: 6 tables of 10 layer slots (52 layers padded to 60) -> 6 · 65 · 10 · 16 · 8,192 B
    #   ideal: 52 layers -> 65 · 52 · 16 · 8,192 B; padding 8 · 65 · 16 · 8,192 B
    vllm = run_cli("frag", "--model", "gemma-3-27b", "--lengths", "5000", "--block", "16", "--json").json()
    ideal = run_cli("frag", "--model", "gemma-3-27b", "--lengths", "5000", "--block", "16", "--layout", "ideal",
                    "--json").json()
    full = 10 * 5_008 * 8192
    v16, i16 = vllm["paged"][0], ideal["paged"][0]
    assert v16["allocated_kv_bytes"] == full + 60 * 65 * 16 * 8192
    assert i16["allocated_kv_bytes"] == full + 52 * 65 * 16 * 8192
    assert v16["padding_bytes"] == 8 * 65 * 16 * 8192 and i16["padding_bytes"] == 0
    # useful: 10 · 5,000 + 52 · 1,024 layer-tokens, the same under both layouts; the tail blocks alike
    assert v16["useful_kv_bytes"] == i16["useful_kv_bytes"] == (10 * 5000 + 52 * 1024) * 8192
    assert v16["fragmentation_bytes"] == i16["fragmentation_bytes"]
    # block tables: vllm 7 tables of 313 entries, ideal 2 (each freed sliding block stays as a null entry)
    assert (v16["block_table_bytes_exact"], i16["block_table_bytes_exact"]) == (7 * 313 * 4, 2 * 313 * 4)
    assert vllm["model"]["layout"] == "vllm" and vllm["model"]["kv_cache_groups"] == 7
    groups = {g["kind"]: g for g in v16["groups"]}
    assert (groups["sliding"]["padded_layers"], groups["sliding"]["block_tables"]) == (60, 6)


def test_llama4_chunked_layers_hold_the_current_chunk(run_cli):
    # Llama-4-Scout: 36 chunked (C 8192) + 12 full layers, 4,096 B per token per layer. n = 20,000, B = 16:
    # the current chunk starts at 8192 · floor(19,999/8192) = 16,384: 3,616 tokens in 1,250 − 1,024 = 226 blocks
    # (the last C tokens would have been 8,192 tokens, 512 blocks).
    doc = run_cli("frag", "--model", "llama-4-scout", "--lengths", "20000", "--block", "16", "--json").json()
    b16 = doc["paged"][0]
    chunked = next(g for g in b16["groups"] if g["kind"] == "chunked")
    assert chunked["blocks"] == 3 * 226  # 3 tables of 12 layer slots
    assert chunked["useful_bytes"] == 36 * 3616 * 4096
    assert chunked["allocated_bytes"] == 36 * 226 * 16 * 4096
    out = " ".join(run_cli("frag", "--model", "llama-4-scout", "--lengths", "20000").stdout.split())
    assert "chunked 8,192" in out and "keep only the current chunk" in out and "sliding" not in out


def test_nemotron_h_state_is_its_own_column_and_the_block_is_forced(run_cli):
    # Nemotron-H-56B: 54 Mamba-2 layers of 16,900,096 B of state each per sequence = 912,605,184 B; vllm pages
    # attention in blocks of 4,128 tokens (16 · ceil(16,900,096 / (16 · 4,096))) and each state page is padded to
    # 4,128 · 4,096 = 16,908,288 B in 6 tables of 10 slots (54 layers padded to 60).
    doc = run_cli("frag", "--model", "nemotron-h-56b", "--lengths", "100,5000", "--block", "16", "--json").json()
    b16 = doc["paged"][0]
    assert b16["used_block_size"] == 4128 and "forces it" in b16["block_size_reason"]
    assert b16["state_bytes"] == 2 * 912_605_184
    assert b16["allocated_state_bytes"] == 2 * 60 * 16_908_288
    # attention: 10 layers, ceil(100/4128) + ceil(5000/4128) = 3 blocks of 4,128 tokens · 4,096 B
    assert b16["allocated_kv_bytes"] == 3 * 10 * 4128 * 4096
    assert b16["held_bytes"] == b16["allocated_kv_bytes"] + b16["allocated_state_bytes"] + b16[
        "block_table_bytes_exact"]
    assert doc["model"]["state_bytes_per_seq"] == 912_605_184
    ideal = run_cli("frag", "--model", "nemotron-h-56b", "--lengths", "100,5000", "--block", "16", "--layout",
                    "ideal", "--json").json()["paged"][0]
    assert ideal["used_block_size"] == 16 and ideal["allocated_state_bytes"] == 2 * 912_605_184
    out = run_cli("frag", "--model", "nemotron-h-56b", "--lengths", "100,5000", "--block", "16").stdout
    out = " ".join(out.split())
    assert "recurrent state" in out and "paged, B = 16 → 4,128" in out and "_align_hybrid_block_size" in out


def test_sweep_names_the_best_block_size(run_cli):
    # Llama-3-8B over the worked example: held = 131,072 B · Σ A_B(n) + 4 B · Σ ceil(n/B). B = 1: 968 positions +
    # 968 entries; B = 8: 1,000 + 125 entries ... the fewest bytes at B = 1 (KV dominates the tables).
    doc = run_cli("frag", "--model", "llama-3-8b", "--sweep", "--json").json()
    best = doc["best_block_size"]
    assert best["block_size"] == 1 and best["held_bytes"] == 968 * 131072 + 968 * 4
    assert best["among"] == [1, 8, 16, 32, 64, 128, 256]  # the sizes vLLM accepts: not 2 or 4
    held = {p["block_size"]: p["held_bytes"] for p in doc["paged"]}
    assert held[2] < held[8] and all(held[1] <= held[b] for b in held)
    # a Mamba hybrid under vllm: every size is raised to 4,128, so the tie goes to the smallest asked for
    doc = run_cli("frag", "--model", "nemotron-h-56b", "--block", "16", "--block", "32", "--json").json()
    assert (doc["best_block_size"]["block_size"], doc["best_block_size"]["used_block_size"]) == (16, 4128)


def test_layout_needs_a_model_and_a_known_name(run_cli):
    _assert_bad_input(run_cli("frag", "--layout", "ideal"), "--layout applies to a model's KV cache groups")
    _assert_bad_input(run_cli("frag", "--model", "llama-3-8b", "--layout", "best"), "--layout 'best' is not one of")


def test_single_group_results_are_the_same_under_both_layouts(run_cli):
    vllm = run_cli("frag", "--model", "llama-3-8b", "--sweep", "--json").json()
    ideal = run_cli("frag", "--model", "llama-3-8b", "--sweep", "--layout", "ideal", "--json").json()
    keys = ("allocated_kv_bytes", "useful_kv_bytes", "fragmentation_bytes", "block_table_bytes_exact",
            "block_table_bytes_dense", "held_bytes")
    assert [{k: p[k] for k in keys} for p in vllm["paged"]] == [{k: p[k] for k in keys} for p in ideal["paged"]]


def test_the_mean_is_exact_past_a_double(run_cli, tmp_path):
    # (5 + 3·10^18 + 4·10^18) / 3 = 7,000,000,000,000,000,005 / 3 = 2,333,333,333,333,333,335 exactly; a float
    # would print ...504.
    path = tmp_path / "big.txt"
    path.write_text("5\n3000000000000000000\n4000000000000000000\n")
    assert "mean 2,333,333,333,333,333,335.00" in run_cli("frag", "--lengths-file", str(path)).stdout
    assert "mean 193.60" in run_cli("frag").stdout  # 968 / 5


def test_sweep_adds_the_given_block_sizes(run_cli):
    # frag --sweep --block: --sweep is the union of 1, 2, 4 … 256 and every --block (as its help says),
    # so --block is not ignored: 24 adds a row; 32 is already in the sweep, so the rows are the sweep's
    sweep = [1, 2, 4, 8, 16, 32, 64, 128, 256]

    def sizes(*args):
        result = run_cli("frag", "--lengths", "5", "--sweep", *args, "--json")
        assert result.exit_code == 0, result.stderr
        return [p["block_size"] for p in result.json()["paged"]]

    assert sizes() == sweep
    assert sizes("--block", "24") == sorted([*sweep, 24])
    assert sizes("--block", "32") == sweep


# --- large work: refused with the figure before allocating, a progress bar on stderr only ---------------


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (("--dist", "lognormal:mean=100", "--seed", "-1"), ("--seed -1 is negative", "e.g. --seed 0")),
        (("--dist", "uniform:low=1,high=1e30"), ("high=1e30 is out of range", "<= 2^62")),
        (("--dist", "lognormal:mean=100,mean=200"), ("mean is given twice (mean=100 and mean=200): give it once",)),
        (("--dist", "exponential:mean=1e300"), ("mean=1e300 is out of range", "<= 2^53")),
        (("--dist", "lognormal:mean=100", "--count", "1e400"), ("1.000e+400 lengths (8 bytes each) would take",
                                                                "lower --count")),
        # 10^13 lengths · 8 B = 72.76 TiB: more than any machine these tests run on
        (("--dist", "lognormal:mean=100", "--count", "1e13"), ("would take 72.76 TiB of memory", "lower --count")),
    ],
)
def test_large_or_bad_samples_are_one_line(run_cli, args, fragments):
    _assert_bad_input(run_cli("frag", *args), *fragments)


def test_memory_is_checked_before_drawing(run_cli, monkeypatch):
    from kvcalc.core import host_memory
    from kvcalc.core.inputs import distributions

    monkeypatch.setattr(host_memory, "available_bytes", lambda: 2**30)
    monkeypatch.setattr(distributions.LengthDistribution, "_fill", lambda *a: pytest.fail("drew before the check"))
    # 2·10^8 lengths · 8 B = 1.49 GiB > 1 GiB
    _assert_bad_input(run_cli("frag", "--dist", "uniform:high=9", "--count", "2e8"),
                      "200,000,000 lengths (8 bytes each) would take 1.49 GiB of memory; this machine has 1.00 GiB "
                      "available: lower --count")
    # per-sequence rows: 10^6 · (8 B of lengths + (3 + 2·2) values · 158 B) = 1.114e9 B = 1.04 GiB, refused
    # before the lengths are drawn
    _assert_bad_input(run_cli("frag", "--dist", "uniform:high=9", "--count", "1e6", "--per-seq", "--json"),
                      "1,000,000 lengths with per-sequence rows would take 1.04 GiB", "drop --per-seq")


def test_per_seq_rows_of_a_file_are_checked_too(run_cli, monkeypatch, tmp_path):
    from kvcalc.core import host_memory

    path = tmp_path / "lengths.txt"
    path.write_text("5\n" * 100)
    monkeypatch.setattr(host_memory, "available_bytes", lambda: 1000)  # 100 rows need 100 · 7 · 158 B = 108.01 KiB
    _assert_bad_input(run_cli("frag", "--lengths-file", str(path), "--per-seq", "--json"),
                      "100 lengths with per-sequence rows would take 108.01 KiB")


def test_progress_bar_goes_to_a_terminal_on_stderr_and_never_to_stdout(tmp_path):
    """A real terminal on stderr (a pty), stdout a pipe: the bar is drawn there and --json stays one document."""
    import os
    import pty
    import subprocess

    from kvcalc.cli.frag import PROGRESS_FROM

    leader, follower = pty.openpty()
    command = ["frag", "--dist", "uniform:low=1,high=2048", "--count", str(PROGRESS_FROM), "--json"]
    proc = subprocess.run([sys.executable, "-c", "from kvcalc.cli.app import main; main()", *command],
                          stdout=subprocess.PIPE, stderr=follower, timeout=120, check=False)
    os.close(follower)
    drawn = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the pty is closed once everything is read
            break
        if not chunk:
            break
        drawn += chunk
    os.close(leader)
    assert proc.returncode == 0
    doc = json.loads(proc.stdout)
    assert doc["lengths"]["count"] == PROGRESS_FROM
    assert b"drawing lengths" in drawn or b"paging" in drawn, drawn[:300]


def test_an_empty_trace_path_is_refused_as_empty(run_cli) -> None:
    result = run_cli("frag", "--trace", "mooncake", "")
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: the path is empty: give the path")
    assert "is a directory" not in result.stderr


def test_mamba_cache_mode_state_pages_as_the_pool_holds_them(run_cli):
    # Nemotron-H-56B, the worked example's 5 sequences (37, 91, 128, 201, 511): under vllm a state block is 6 tables
    # · 10 slots · the padded page 16,908,288 B (4,128 tokens · 4,096 B) = 1,014,497,280 B. The pool (vLLM's
    # MambaManager) holds pages (n − 2) // B .. (n − 1) // B under align and all: n − 1 = 36, 90, 127, 200, 510 is
    # no multiple of B, so 1 page each, as "none" (was 2 a sequence under align: the page behind is freed)
    none = run_cli("frag", "--model", "nemotron-h-56b", "--json").json()["paged"][0]
    align = run_cli("frag", "--model", "nemotron-h-56b", "--mamba-cache-mode", "align", "--json").json()["paged"][0]
    assert none["allocated_state_bytes"] == align["allocated_state_bytes"] == 5 * 1_014_497_280
    assert none["state_bytes"] == align["state_bytes"] == 5 * 912_605_184  # what the states hold, padding aside
    _assert_bad_input(run_cli("frag", "--mamba-cache-mode", "align"), "--mamba-cache-mode applies to a model")
    _assert_bad_input(run_cli("frag", "--model", "nemotron-h-56b", "--mamba-cache-mode", "every"),
                      "--mamba-cache-mode 'every' is not one of none, align, all")
    # all: the block 4,224 (16 · ceil(16,900,096 / (16 · 4,096)) = 4,128 aligned up to the kernel's chunk 128), a
    # state block 6 · 10 · 4,224 · 4,096 = 1,038,090,240 B; 1 page a sequence (was ceil(n / 4,224), 1 each here too)
    every = run_cli("frag", "--model", "nemotron-h-56b", "--mamba-cache-mode", "all", "--json")
    assert every.exit_code == 0 and every.json()["paged"][0]["allocated_state_bytes"] == 5 * 1_038_090_240


def test_state_pages_when_the_last_step_crossed_into_a_page(run_cli, tmp_path):
    # Nemotron-H-56B from a lengths file (all within max_position_embeddings 8,192). Per sequence and state table,
    # pages (n − 2) // B .. (n − 1) // B (n = 1: page 0 only): 1, or 2 when n − 1 is a multiple of B.
    # align, B = 4,128: n = 1 -> 1; 4,128 -> 4,127 // B = 0 .. 0 -> 1; 4,129 -> 0 .. 1 -> 2; 5,000 -> 1 .. 1 -> 1:
    # 5 a table · 6 tables = 30 block ids of 10 · 4,128 · 4,096 = 169,082,880 B (none: 4 · 6 = 24).
    # all, B = 4,224: n = 1, 4,224, 4,225, 5,000 -> 1 + 1 + 2 + 1 = 5 (was ceil(n / B) = 1 + 1 + 2 + 2 = 6) -> 30
    # ids of 10 · 4,224 · 4,096 = 173,015,040 B. Full attention, one table: ceil(n / B) = 1 + 1 + 2 + 2 = 6 both.
    cases = {"align": ([1, 4128, 4129, 5000], 169_082_880), "all": ([1, 4224, 4225, 5000], 173_015_040),
             "none": ([1, 4128, 4129, 5000], 169_082_880)}
    for mode, (lengths, block) in cases.items():
        path = tmp_path / f"{mode}.txt"
        path.write_text("".join(f"{n}\n" for n in lengths))
        result = run_cli("frag", "--model", "nemotron-h-56b", "--mamba-cache-mode", mode, "--lengths-file", str(path),
                         "--block", "16", "--json")
        assert result.exit_code == 0, result.stderr
        paged = result.json()["paged"][0]
        full, state = paged["groups"]
        ids = 24 if mode == "none" else 30
        assert (full["blocks"], state["blocks"], state["block_bytes"]) == (6, ids, block)
        assert paged["allocated_state_bytes"] == ids * block
        # the table entries stay ceil(n / B) a state table (null entries behind), 1 under none: (6 + 6 · 6) · 4 B
        assert paged["block_table_bytes_exact"] == 4 * (6 + 6 * (4 if mode == "none" else 6))


def test_speculative_peak_state_pages_under_all(run_cli):
    # Nemotron-H-56B, all (B = 4,224, a state block 1,038,090,240 B over its 6 tables), K = 4: the peak step runs
    # from n − 1 to n + extra (extra = the slots past the committed tokens, a few): pages (n − 2) // B ..
    # (n + extra − 1) // B. n = 4,224: 0 .. 1 -> 2 (plain 1); n = 5,000: 1 .. 1 -> 1 (plain 1): 3 at the peak, 2 plain
    doc = run_cli("frag", "--model", "nemotron-h-56b", "--mamba-cache-mode", "all", "--spec-tokens", "4",
                  "--lengths", "4224,5000", "--json").json()
    assert 0 < doc["speculative"]["extra_slots_per_seq"] < 5000 - 4224
    assert doc["paged"][0]["allocated_state_bytes"] == 2 * 1_038_090_240
    peak = doc["speculative"]["paged"][0]
    assert peak["peak_allocated_state_bytes"] == 3 * 1_038_090_240
    # the full group: ceil(4,224 / B) + ceil(5,000 / B) = 3 plain; 4,224 + extra passes into a second block: 4
    assert peak["extra_kv_bytes"] == 173_015_040 + 1_038_090_240
