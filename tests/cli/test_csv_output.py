"""`--format csv` is for scripts: every table of every command carries raw values, consistent with --json.

Two kinds of checks. (1) Over every command x representative options, the CSV parses and every cell is
empty, an int, a float, true/false or a plain label (no thousands separator, unit, "%", "—", "†"), every
header is snake_case, and there are as many CSV tables as tables for people (markdown). (2) The values in
the CSV are the values of the --json document of the same run (exact ints, floats that round-trip), plus a
few hand-computed anchors (frag's built-in worked example).
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

from kvcalc.cli.json_doc import LONG_LIST
from kvcalc.cli.output import (
    Field,
    Format,
    RawTable,
    Report,
    Table,
    csv_cell,
    emit,
    quantity_table,
    record_table,
    to_json,
)

INT = re.compile(r"-?\d+")
FLOAT = re.compile(r"-?\d+\.\d+(e[-+]\d+)?|-?\d+e[-+]\d+")
LABEL = re.compile(r"[A-Za-z][A-Za-z0-9_.+\-]*")  # model names (Llama-3.1-405B), policies (reserve-max), dtypes
COLUMN = re.compile(r"[a-z][a-z0-9_]*")


def cell_value(cell: str) -> Any:
    """A CSV cell as the value a script reads; fails on anything that is not machine-readable."""
    if cell == "":
        return None
    if cell in ("true", "false"):
        return cell == "true"
    if INT.fullmatch(cell):
        return int(cell)
    if FLOAT.fullmatch(cell):
        return float(cell)
    assert LABEL.fullmatch(cell), f"CSV cell {cell!r} is not empty, a number, true/false or a plain label"
    return cell


def csv_tables(text: str) -> dict[str | None, list[dict[str, Any]]]:
    """Parse kvcalc's CSV: tables separated by a blank line, each after a `# title` line when there are several.

    Returns {title (None for a lone table): one dict per row}, checking headers and widths on the way.
    """
    chunks = text.rstrip("\n").split("\n\n")
    tables: dict[str | None, list[dict[str, Any]]] = {}
    for chunk in chunks:
        lines = chunk.split("\n")
        title = None
        if lines[0].startswith("# "):
            title = lines[0][2:]
            lines = lines[1:]
        assert (title is None) == (len(chunks) == 1), "a title line before each table exactly when there are several"
        header, *rows = list(csv.reader(lines))
        for column in header:
            assert COLUMN.fullmatch(column), f"CSV column {column!r} is not snake_case"
        assert len(set(header)) == len(header), f"repeated CSV columns in {header}"
        assert rows, f"table {title!r} has no rows"
        for row in rows:
            assert len(row) == len(header), f"{row} does not match {header}"
        tables[title] = [dict(zip(header, map(cell_value, row), strict=True)) for row in rows]
    return tables


def assert_same(row: dict[str, Any], obj: dict[str, Any], expected_keys: set[str]) -> None:
    """Every CSV column that the JSON object also has (a scalar) holds the JSON's value; `expected_keys` must be
    among them, so that a renamed column cannot make the comparison vacuous."""
    common = {k for k, v in obj.items() if not isinstance(v, (dict, list))} & row.keys()
    assert expected_keys <= common, f"missing from the CSV: {expected_keys - common}"
    for key in common:
        assert row[key] == obj[key], f"{key}: CSV {row[key]!r} != JSON {obj[key]!r}"


@pytest.fixture
def inputs(tmp_path: Path) -> dict[str, str]:
    lengths = tmp_path / "lengths.txt"
    lengths.write_text("\n".join(str(n) for n in range(1, 121)) + "\n")  # 120 lengths: above the per-seq limit
    azure = tmp_path / "azure.csv"
    azure.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                     + "".join(f"2023-11-16 18:15:{s:02d}.0,{100 + 37 * s},{5 + s}\n" for s in range(30)))
    mooncake = tmp_path / "mooncake.jsonl"
    mooncake.write_text("\n".join(json.dumps(r) for r in [
        {"timestamp": 0, "input_length": 1000, "output_length": 10, "hash_ids": [0, 1]},
        {"timestamp": 5, "input_length": 1100, "output_length": 10, "hash_ids": [0, 1, 2]},
        {"timestamp": 9, "input_length": 600, "output_length": 10, "hash_ids": [0, 3]},
    ]) + "\n")
    return {"lengths": str(lengths), "azure": str(azure), "mooncake": str(mooncake),
            "timeline": str(tmp_path / "timeline.csv")}


SIM_SMALL = ("--requests", "40", "--rate", "4")
CASES = {
    "size presets": ("size",),
    "size presets at 5000 tokens, fp8": ("size", "--tokens", "5000", "--dtype", "fp8"),
    "size model": ("size", "-m", "llama-3-8b"),
    "size tp + memory, beyond max positions": ("size", "-m", "llama-3-8b", "--tokens", "9000", "--seqs", "3",
                                               "--tp", "4", "--memory", "80GiB"),
    "size MLA tp": ("size", "-m", "deepseek-v3", "--tp", "2", "--memory", "40GB"),
    "size int4 half byte": ("size", "--layers", "1", "--kv-heads", "1", "--head-dim", "1", "--dtype", "int4",
                            "--tokens", "1"),
    "frag worked example": ("frag",),
    "frag sweep": ("frag", "--sweep"),
    "frag model with sliding window": ("frag", "-m", "gemma-2-9b", "--block", "16", "--block", "64"),
    "frag file, no per-seq": ("frag", "--lengths-file", "{lengths}", "--max-len", "256"),
    "frag file, --per-seq": ("frag", "--lengths-file", "{lengths}", "--per-seq", "-m", "llama-3-8b", "--dtype", "fp8"),
    "frag dist": ("frag", "--dist", "lognormal:mean=500,sigma=0.8", "--count", "300", "--seed", "1"),
    "frag azure trace": ("frag", "--trace", "azure", "{azure}", "--phase", "prompt"),
    "share scenario": ("share",),
    "share beam with model": ("share", "--mode", "beam", "--gen", "40", "-m", "llama-3-8b"),
    "share mooncake trace": ("share", "--trace", "mooncake", "{mooncake}", "--block", "16"),
    "share trace, capacity": ("share", "--trace", "mooncake", "{mooncake}", "--capacity-blocks", "70"),
    "share azure trace": ("share", "--trace", "azure", "{azure}"),
    "sim default policy": ("sim", *SIM_SMALL),
    "sim compare, slo, max rate": ("sim", *SIM_SMALL, "--compare", "paged,reserve-max", "--slo", "ttft=1,tpot=50ms",
                                   "--max-rate"),
    "sim trace, cancellations, timeline": ("sim", "--trace", "mooncake", "{mooncake}", "--cancel-fraction", "0.5",
                                           "--timeline", "{timeline}"),
}


@pytest.mark.parametrize("args", CASES.values(), ids=CASES.keys())
def test_every_csv_cell_is_machine_readable(run_cli, inputs, args):
    args = [a.format(**inputs) for a in args]
    result = run_cli(*args, "--format", "csv")
    assert result.exit_code == 0, result.stderr
    tables = csv_tables(result.stdout)
    markdown = run_cli(*args, "--format", "markdown").stdout
    assert len(tables) == markdown.count("### ")  # every table people see has its CSV form


def test_bench_cpu_csv_matches_its_saved_json(run_cli, tmp_path):
    pytest.importorskip("torch")
    saved = tmp_path / "bench.json"
    result = run_cli("bench", "--device", "cpu", "--batch", "2", "--context", "40", "--iters", "1", "--warmup", "0",
                     "--skip-correctness", "--format", "csv", "--save", str(saved))
    assert result.exit_code == 0, result.stderr
    doc = json.loads(saved.read_text())  # the same run's JSON: timings differ from run to run
    (rows,) = csv_tables(result.stdout).values()
    assert len(rows) == len(doc["timing"]) == 1
    assert_same(rows[0], doc["timing"][0], {"batch", "context", "block_size", "paged_us", "contiguous_us",
                                            "paged_over_contiguous", "bytes", "achieved_tbps", "fraction_of_copy"})
    assert rows[0]["fraction_of_copy"] is None  # no copy ceiling on CPU: empty, not "-"


def test_bench_cuda_shaped_report_aggregates_correctness_and_keeps_comparator_columns():
    from kvcalc.cli.bench import _report

    def case(dtype, dim, rel_err, diff, passed):
        return {"dtype": dtype, "head_dim": dim, "group_size": 1, "block_size": 16, "lengths": [1], "max_abs_err": 0.0,
                "rel_err": rel_err, "tolerance": 2e-3 if dtype == "fp16" else 1e-2,
                "paged_vs_contiguous_max_diff": diff, "passed": passed}

    timing = {"batch": 4, "context": 1024, "block_size": 16, "paged_us": 10.5, "contiguous_us": 10.0,
              "paged_over_contiguous": 1.05, "bytes": 1 << 20, "achieved_tbps": 2.5, "fraction_of_copy": 0.75,
              "timed_outputs_match": True, "sdpa_us": 12.25, "flex_paged_us": None}
    doc = {"device": {"type": "cuda", "name": "Fake", "driver": "0", "cuda": "13.0", "torch": "2"},
           "implementation": "test", "copy_tbps": 3.0, "passed": False,
           "config": {"dtype": "bf16", "head_dim": 128, "num_q_heads": 32, "num_kv_heads": 8},
           "correctness": [case("fp16", 64, 1e-4, 0.0, True), case("fp16", 64, 3e-3, 0.5, False),
                           case("bf16", 128, 2e-3, 0.0, True)],
           "timing": [timing], "block_sweep": []}
    correctness, timings = csv_tables(_csv(_report(doc))).values()
    # fp16/64: two cases, the worst relative error 3e-3 and difference 0.5, one of the two passed
    assert correctness == [
        {"dtype": "fp16", "head_dim": 64, "cases": 2, "max_rel_err": 3e-3, "tolerance": 2e-3,
         "max_paged_vs_contiguous_diff": 0.5, "passed_cases": 1},
        {"dtype": "bf16", "head_dim": 128, "cases": 1, "max_rel_err": 2e-3, "tolerance": 1e-2,
         "max_paged_vs_contiguous_diff": 0.0, "passed_cases": 1},
    ]
    assert timings == [timing]  # every JSON key of the row, flex_paged_us None -> empty


def test_frag_worked_example_csv_is_the_json(run_cli):
    tables = csv_tables(run_cli("frag", "--format", "csv").stdout)
    doc = run_cli("frag", "--json").json()
    fixed, *paged = tables["Fixed reservation vs paging (token positions)"]
    # the worked example: 37 + 91 + 128 + 201 + 511 = 968 useful positions; fixed reservation 5 × 512 = 2560
    assert (fixed["scheme"], fixed["max_len"], fixed["useful"], fixed["allocated"]) == ("fixed", 512, 968, 2560)
    assert fixed["utilization"] == 968 / 2560 == 0.378125 and fixed["blocks"] is None
    assert [(p["block_size"], p["allocated"]) for p in paged] == [(16, 992), (32, 1024)]
    assert paged[0]["block_table_bytes_exact"] == 62 * 4  # 3 + 6 + 8 + 13 + 32 = 62 int32 block ids
    assert_same(fixed, doc["fixed"], {"max_len", "useful", "allocated", "waste", "utilization"})
    keys = {"block_size", "blocks", "useful", "allocated", "waste", "utilization", "block_table_bytes_exact",
            "block_table_bytes_dense"}
    for row, entry in zip(paged, doc["paged"], strict=True):
        assert_same(row, entry, keys)
    per_seq = tables["Per sequence (token positions)"]
    assert [row["seq"] for row in per_seq] == [1, 2, 3, 4, 5]
    for row, entry in zip(per_seq, doc["per_seq"], strict=True):
        assert_same(row, entry, set(entry))


def test_frag_model_bytes_csv_is_the_json(run_cli):
    args = ("frag", "-m", "llama-3-8b", "--dtype", "fp16", "--lengths", "37,91,128,201,511")
    tables = csv_tables(run_cli(*args, "--format", "csv").stdout)
    doc = run_cli(*args, "--json").json()
    fixed, *paged = tables["KV bytes — Llama-3-8B, fp16 (128.00 KiB per token), layout vllm"]
    # 2 · 32 layers · 8 KV heads · 128 dim · 2 B = 131,072 B per token; 968 useful tokens
    assert fixed["bytes_per_token"] == 131_072 and fixed["useful_kv_bytes"] == 968 * 131_072
    assert fixed["reservation_waste_bytes"] == 1592 * 131_072 and fixed["fragmentation_bytes"] is None
    assert_same(fixed, doc["fixed"], {"useful_kv_bytes", "allocated_kv_bytes", "reservation_waste_bytes"})
    for row, entry in zip(paged, doc["paged"], strict=True):
        assert_same(row, entry, {"block_size", "useful_kv_bytes", "allocated_kv_bytes", "fragmentation_bytes",
                                 "block_table_bytes_exact", "block_table_bytes_dense"})
        assert row["reservation_waste_bytes"] is None


def test_size_csv_is_the_json(run_cli):
    args = ("size", "-m", "llama-3-8b", "--tokens", "9000", "--seqs", "3", "--tp", "4", "--memory", "80GiB")
    kv, capacity = csv_tables(run_cli(*args, "--format", "csv").stdout).values()
    doc = run_cli(*args, "--json").json()
    (row,) = kv
    assert row["bytes_per_token"] == 2 * 32 * 8 * 128 * 2 and row["total_bytes"] == 3 * 9000 * 131_072
    assert row["model"] == doc["model"]["name"] == "Llama-3-8B"
    assert row["exceeds_max_positions"] is True  # 9,000 > 8,192: the warning's flag
    assert_same(row, doc, {"dtype", "bits_per_scalar", "bytes_per_token_per_layer", "bytes_per_token", "block_size",
                           "bytes_per_block", "tokens", "seqs", "tp", "kv_heads_per_gpu", "bytes_per_seq",
                           "total_bytes", "per_gpu_bytes", "per_gpu_bytes_per_token", "total_bits"})
    (cap,) = capacity
    assert cap["memory_bytes"] == 80 * 2**30 and cap["fits"] is True
    assert_same(cap, doc["capacity"], set(doc["capacity"]) - {"vllm_block_reason"})  # prose: JSON only


def test_size_presets_csv_is_the_json_and_flags_the_dagger(run_cli):
    (rows,) = csv_tables(run_cli("size", "--tokens", "5000", "--format", "csv").stdout).values()
    doc = run_cli("size", "--tokens", "5000", "--json").json()
    for row, model in zip(rows, doc["models"], strict=True):
        assert row["model"] == model["name"]
        assert_same(row, model, {"attention", "layers", "kv_heads", "head_dim", "max_position_embeddings",
                                 "bytes_per_token"})
        for n in (4096, 32768, 131072, 5000):
            assert row[f"bytes_per_seq_{n}"] == model["bytes_per_seq"][str(n)]
            assert row[f"exceeds_max_positions_{n}"] is (n > model["max_position_embeddings"])
    opt = rows[0]  # OPT-13B: 2,048 positions, 2 · 40 · 40 · 128 · 2 B = 819,200 B per token
    assert opt["model"] == "OPT-13B" and opt["bytes_per_seq_4096"] == 4096 * 819_200
    assert opt["exceeds_max_positions_4096"] is True
    assert "†" in run_cli("size", "--format", "markdown").stdout  # people keep the mark


def test_share_csv_is_the_json(run_cli, inputs):
    for args in (("share", "--mode", "beam", "--gen", "40", "-m", "llama-3-8b"), ("share",)):
        (rows,) = csv_tables(run_cli(*args, "--format", "csv").stdout).values()
        doc = run_cli(*args, "--json").json()
        assert_same(rows[0], doc, {"mode", "prefix_tokens", "branches", "gen_tokens", "block_size", "logical_blocks",
                                   "physical_blocks", "cow_copies", "saved_blocks", "saved_fraction", "peak_blocks",
                                   "forks"})
    # parallel default, closed form: floor(1000/16) + 4 · ceil((1000 mod 16 + 200)/16) = 62 + 4 · 13 = 114
    assert rows[0]["physical_blocks"] == 114 and rows[0]["saved_fraction"] == (300 - 114) / 300
    assert rows[0]["seed"] is None and rows[0]["logical_bytes"] is None  # parallel mode, no model
    args = ("share", "--trace", "mooncake", inputs["mooncake"], "--capacity-blocks", "200")
    (rows,) = csv_tables(run_cli(*args, "--format", "csv").stdout).values()
    doc = run_cli(*args, "--json").json()
    cached, uncached = rows
    assert (cached["prefix_caching"], uncached["prefix_caching"]) == (True, False)
    keys = {"requests", "prompt_tokens", "hit_tokens", "token_hit_rate", "hit_blocks", "peak_used_blocks",
            "evictions"}
    assert_same(cached, doc, keys | {"block_size", "capacity_blocks"})
    assert_same(uncached, doc["without_prefix_caching"], keys)
    # request 2 hits the 62 full blocks of 16 that request 1 (1,000 tokens) cached = 992 tokens; request 3 shares
    # hash id 0 (512 tokens) and misses id 3: 992 + 512 = 1,504
    assert cached["hit_tokens"] == 1504


def test_sim_csv_is_the_json(run_cli):
    args = ("sim", *SIM_SMALL, "--compare", "paged,reserve-max", "--slo", "ttft=1", "--max-rate")
    latency, memory, rates = csv_tables(run_cli(*args, "--format", "csv").stdout).values()
    doc = run_cli(*args, "--json").json()
    assert [row["policy"] for row in latency] == ["paged", "reserve-max"]
    for row, mem, rate in zip(latency, memory, rates, strict=True):
        summary = doc["policies"][row["policy"]]
        assert_same(row, summary, {"requests", "completed", "rejected", "preemptions", "throughput_rps",
                                   "goodput_rps", "slo_attainment", "peak_running", "mean_running"})
        for key in ("ttft", "tpot", "itl", "e2e"):
            for stat in ("mean", "p50", "p90", "p99"):
                assert row[f"{key}_{stat}_s"] == summary[f"{key}_s"][stat]  # seconds, as the JSON
        assert_same(mem, summary["memory"], set(summary["memory"]))
        assert mem["block_table_bytes_mean"] == summary["block_table_bytes_mean"]
        assert rate["max_rate_rps"] == doc["max_rate_rps"][rate["policy"]]
        low, high = doc["max_rate_search"][rate["policy"]]["bracket_rps"]
        assert (rate["bracket_low_rps"], rate["bracket_high_rps"]) == (low, high)  # an unbounded high: JSON null, empty


def test_markdown_and_table_keep_display_strings(run_cli):
    markdown = run_cli("frag", "--format", "markdown").stdout
    assert "| fixed, M = 512" in markdown and "37.81 %" in markdown and "2,560" in markdown and "248 B" in markdown
    table = run_cli("frag").stdout
    assert "37.81 %" in table and "—" in table and "utilization" not in table


# --- the sink itself ------------------------------------------------------------------------------------------


@given(st.lists(st.integers(min_value=0, max_value=10**30), min_size=1, max_size=8),
       st.integers(min_value=20, max_value=200))
def test_the_rich_table_never_cuts_a_number(values: list[int], width: int) -> None:
    # A terminal narrower than the table: rich would shrink columns and print "6,417,0…"; every cell must
    # appear whole on one line, whatever the width.
    cells = [f"{v:,}" for v in values]
    buffer = io.StringIO()
    table = Table("big", ["scheme", *(f"column number {i}" for i in range(len(cells)))], [["fixed, M = 512", *cells]])
    emit(Report(doc={}, tables=[table]), Format.table, Console(file=buffer, width=width))
    text = buffer.getvalue()
    assert "…" not in text
    row = next(line for line in text.splitlines() if "fixed, M = 512" in line)
    assert [c.strip() for c in row.strip("│").split("│")] == ["fixed, M = 512", *cells]


def test_markdown_prints_display_strings_unparsed() -> None:
    # tabulate would re-read "3.00e-03" as 0.003 and "1,024" as 1024; markdown shows what people see.
    buffer = io.StringIO()
    report = Report(doc={}, tables=[Table("t", ["case", "rel err", "tokens"], [["a", "3.00e-03", "1,024"]])])
    emit(report, Format.markdown, Console(file=buffer))
    assert "| a      |  3.00e-03 |    1,024 |" in buffer.getvalue()


def _csv(report: Report) -> str:
    buffer = io.StringIO()
    emit(report, Format.csv, Console(file=buffer))
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("value", "cell"),
    [(None, ""), (True, "true"), (False, "false"), (np.bool_(True), "true"), (2560, "2560"),
     (np.int64(2**40), "1099511627776"), (0.378125, "0.378125"), (Fraction(968, 2560), "0.378125"),
     (np.float64(0.5), "0.5"), (float("nan"), ""), (float("inf"), ""), ("reserve-max", "reserve-max")],
)
def test_csv_cell(value, cell):
    assert csv_cell(value) == cell


@pytest.mark.parametrize("value", [[1, 2], {"a": 1}, b"x", object()])
def test_csv_cell_refuses_what_is_not_a_value(value):
    with pytest.raises(TypeError, match="CSV cell"):
        csv_cell(value)


@given(st.floats(allow_nan=False, allow_infinity=False) | st.integers())
def test_csv_cells_round_trip(value):
    assert cell_value(csv_cell(value)) == value


def test_a_table_without_raw_form_cannot_be_written_as_csv():
    good = record_table("good", [Field("n", "n")], [{"n": 1}])
    display_only = Table("display only", ["n"], [["1,000"]])
    buffer = io.StringIO()
    with pytest.raises(TypeError, match="'display only' has no raw form"):
        emit(Report(doc={}, tables=[good, display_only]), Format.csv, Console(file=buffer))
    assert buffer.getvalue() == ""  # nothing half-written
    with pytest.raises(TypeError, match="a raw row of 1 cells for 2 columns"):
        _csv(Report(doc={}, tables=[Table("t", ["a"], [], raw=RawTable(["a", "b"], [[1]]))]))


def test_record_and_quantity_tables_build_both_forms_from_one_record():
    fields = [Field(None, "scheme", lambda r: f"paged, B = {r['block_size']}"), Field("block_size"),
              Field("allocated", "allocated", "{:,}".format), Field("blocks", "blocks")]
    records = [{"block_size": 16, "allocated": 2560, "blocks": None}]
    table = record_table("t", fields, records)
    assert (table.columns, table.rows) == (["scheme", "allocated", "blocks"], [["paged, B = 16", "2,560", "—"]])
    assert table.raw == RawTable(["block_size", "allocated", "blocks"], [[16, 2560, None]])
    assert _csv(Report(doc={}, tables=[table])) == "block_size,allocated,blocks\n16,2560,\n"
    fields = [Field("total_bytes", "all", lambda b: [f"{b:,}", "1 KiB"]), Field("tp")]
    both = quantity_table("q", ["quantity", "bytes", "IEC"], fields, [{"total_bytes": 1024, "tp": 2}])
    assert (both.columns, both.rows) == (["quantity", "bytes", "IEC"], [["all", "1,024", "1 KiB"]])
    assert both.raw == RawTable(["total_bytes", "tp"], [[1024, 2]])
    assert math.isclose(cell_value("5.620047204906951e-05"), 5.620047204906951e-05)


_json_leaf = st.one_of(st.none(), st.booleans(), st.integers(min_value=-2**70, max_value=2**70), st.floats(),
                       st.text(max_size=5))
_json_doc = st.recursive(_json_leaf, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                             st.dictionaries(st.text(max_size=4), inner, max_size=4)),
                         max_leaves=20)


def _reference_json(doc: Any) -> str:
    def clean(value: Any) -> Any:
        if isinstance(value, float) and not math.isfinite(value):
            return None
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items()}
        if isinstance(value, list):
            return [clean(v) for v in value]
        return value

    return json.dumps(clean(doc), indent=2)


@given(st.dictionaries(st.text(max_size=6), _json_doc, max_size=5))
def test_to_json_is_json_dumps_indent_2_for_ordinary_documents(doc: dict) -> None:
    # The README's JSON examples and scripts see exactly what json.dumps(indent=2) prints, NaN/inf as null.
    assert to_json(doc) == _reference_json(doc)


def test_to_json_prints_long_lists_one_compact_element_per_line() -> None:
    rows = [{"n": i, "waste": float("nan") if i == 7 else i / 2, "ids": np.arange(2)} for i in range(LONG_LIST + 1)]
    doc = {"count": np.int64(LONG_LIST + 1), "mean": Fraction(1, 3), "per_seq": rows}
    text = to_json(doc)
    lines = text.splitlines()
    assert lines[0] == "{" and lines[1] == '  "count": 1001,' and lines[3] == '  "per_seq": ['
    assert lines[4] == '    {"n": 0, "waste": 0.0, "ids": [0, 1]},'
    assert '    {"n": 7, "waste": null, "ids": [0, 1]},' in lines  # NaN -> null inside a compact element
    parsed = json.loads(text)
    assert parsed["mean"] == 1 / 3 and len(parsed["per_seq"]) == LONG_LIST + 1 and parsed["per_seq"][7]["waste"] is None
