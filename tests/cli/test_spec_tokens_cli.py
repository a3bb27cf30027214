"""`--spec-tokens` through `kvcalc frag` and `kvcalc size`: the JSON keys, the tables, CSV, bad input."""

from __future__ import annotations

import csv
import io

import pytest

SPEC_KEYS = {"spec_tokens", "method", "lookahead_slots", "slots_per_step", "extra_slots_per_seq", "peak_blocks_formula"}
FRAG_PAGED_KEYS = {"block_size", "blocks", "peak_blocks", "extra_blocks", "extra_fraction", "peak_allocated",
                   "peak_utilization", "concurrency_ratio"}


def _assert_bad_input(result, *fragments: str) -> None:
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    for fragment in fragments:
        assert fragment in result.stderr, (fragment, result.stderr)


def test_frag_json(run_cli):
    doc = run_cli("frag", "--spec-tokens", "4", "--json").json()
    spec = doc["speculative"]
    assert spec.keys() >= SPEC_KEYS | {"paged"}
    assert (spec["spec_tokens"], spec["method"], spec["lookahead_slots"], spec["slots_per_step"],
            spec["extra_slots_per_seq"]) == (4, "draft", 4, 9, 8)
    b16, b32 = spec["paged"]
    assert all(entry.keys() >= FRAG_PAGED_KEYS for entry in spec["paged"])
    # the worked example + 8 slots each (core tests do the sums by hand): 62 -> 66 and 32 -> 35 blocks
    assert (b16["blocks"], b16["peak_blocks"], b16["extra_blocks"]) == (62, 66, 4)
    assert (b32["blocks"], b32["peak_blocks"], b32["extra_blocks"]) == (32, 35, 3)
    assert b16["peak_utilization"] == pytest.approx(968 / 1056)
    assert b16["concurrency_ratio"] == pytest.approx(62 / 66)
    assert doc["fixed"]["max_len"] == 1024  # M holds the longest peak, 511 + 8
    assert doc["paged"][0]["blocks"] == 62  # the plain results are unchanged


def test_frag_json_with_a_model_and_ngram(run_cli):
    doc = run_cli("frag", "--spec-tokens", "2", "--spec-method", "ngram", "--model", "llama-3.1-8b", "--json").json()
    b16 = doc["speculative"]["paged"][0]
    assert doc["speculative"]["lookahead_slots"] == 0
    # n + 2: 64 blocks of 16 · 131,072 B a token; 2 more than plain: 2 · 16 · 131,072 = 4 MiB
    assert b16["peak_allocated_kv_bytes"] == 64 * 16 * 131072 and b16["extra_kv_bytes"] == 4 * 2**20


def test_frag_table_and_csv(run_cli):
    table = run_cli("frag", "--spec-tokens", "4")
    assert table.exit_code == 0, table.stderr
    assert "Speculative decoding: 4 drafts + 4 lookahead slots per step (draft), peak blocks ceil((n + 2·4) / B)" \
        in table.stdout
    assert "M is the smallest power of two that holds the longest peak" in table.stdout
    tables = run_cli("frag", "--spec-tokens", "4", "--format", "csv").stdout.split("\n\n")
    (speculative,) = [t for t in tables if t.startswith("# Speculative decoding")]
    rows = list(csv.DictReader(io.StringIO(speculative.split("\n", 1)[1])))
    assert [(r["block_size"], r["peak_blocks"], r["spec_tokens"]) for r in rows] == [("16", "66", "4"),
                                                                                   ("32", "35", "4")]


def test_frag_spec_tokens_zero_changes_nothing(run_cli):
    plain, zero = run_cli("frag", "--json").json(), run_cli("frag", "--spec-tokens", "0", "--json").json()
    assert {k: v for k, v in zero.items() if k != "speculative"} == plain
    assert [e["extra_blocks"] for e in zero["speculative"]["paged"]] == [0, 0]


def test_size_json_and_table(run_cli):
    result = run_cli("size", "-m", "llama-3.1-8b", "--tokens", "4096", "--memory", "40GiB", "--spec-tokens", "4")
    assert result.exit_code == 0, result.stderr
    assert "at the speculative peak" in result.stdout and "4,104" in result.stdout
    doc = run_cli("size", "-m", "llama-3.1-8b", "--tokens", "4096", "--memory", "40GiB", "--spec-tokens", "4",
                  "--json").json()
    spec = doc["speculative"]
    assert spec.keys() >= SPEC_KEYS
    assert (spec["peak_slots"], spec["blocks_per_seq"], spec["peak_blocks_per_seq"]) == (4104, 256, 257)
    assert (spec["max_seqs_paged"], spec["max_seqs"]) == (80, 79)
    assert spec["trimmed_at_max_model_len"] is False and spec["max_model_len"] == 131072


def test_size_trims_at_the_max_model_len(run_cli):
    spec = run_cli("size", "-m", "llama-3.1-8b", "--spec-tokens", "4", "--json").json()["speculative"]
    assert spec["tokens"] == 131072 and spec["trimmed_at_max_model_len"] is True and spec["extra_blocks_per_seq"] == 0
    table = run_cli("size", "-m", "llama-3.1-8b", "--spec-tokens", "4").stdout
    assert "vLLM schedules no position past max_model_len 131,072" in table


@pytest.mark.parametrize(("args", "fragments"), [
    (("frag", "--spec-tokens", "-1"), ("--spec-tokens -1 is not a number of drafts",)),
    (("frag", "--spec-method", "ngram"), ("--spec-method 'ngram' applies to speculative decoding", "--spec-tokens")),
    (("frag", "--spec-tokens", "2", "--spec-method", "medusa"), ("--spec-method 'medusa' is not a drafting method",)),
    (("frag", "--spec-tokens", "4", "--max-len", "512"),
     ("--max-len 512 cannot hold the speculative peak", "511 tokens + 8 slots", "at least 519", "--spec-tokens")),
    (("frag", "--spec-tokens", "4611686018427387904"), ("--spec-tokens 4.612e+18 is too many", "2^62")),
    (("frag", "--spec-tokens", "x"), ("--spec-tokens 'x' is not an integer",)),
    (("size", "--spec-tokens", "4"), ("--spec-tokens needs a model",)),
    (("size", "-m", "llama-3.1-8b", "--spec-tokens", "-2"), ("--spec-tokens -2 is not a number of drafts",)),
    (("size", "-m", "llama-3.1-8b", "--spec-method", "ngram"), ("--spec-method 'ngram' applies",)),
])
def test_bad_input_is_one_line(run_cli, args, fragments):
    _assert_bad_input(run_cli(*args), *fragments)
