"""`kvcalc sim --spec-tokens`: the JSON `speculative` object, the comparison with plain decoding, --compare,
and bad input as one line with the flag named."""

from __future__ import annotations

import pytest

SMALL = ("--requests", "30", "--rate", "0.5", "--output-dist", "uniform:low=300,high=300")
SPEC = ("--spec-tokens", "4", "--spec-acceptance", "0.7")


def test_json_speculative_object(run_cli):
    result = run_cli("sim", *SMALL, *SPEC, "--json")
    assert result.exit_code == 0, result.stderr
    doc = result.json()
    spec = doc["speculative"]
    assert (spec["spec_tokens"], spec["acceptance"], spec["rollback_policy"], spec["lookahead_slots"]) == (
        4, 0.7, "keep", 4)
    assert spec["closed_form_tokens_per_step"] == pytest.approx((1 - 0.7**5) / 0.3)
    # 30 requests x 299 decode tokens: ~3,250 speculating steps, so well within 5 % (ends emit fewer)
    assert spec["mean_tokens_per_step"] == pytest.approx(spec["closed_form_tokens_per_step"], rel=0.05)
    assert spec["mean_accepted_per_step"] == pytest.approx(spec["mean_tokens_per_step"] - 1, rel=0.05)
    assert doc["memory"]["speculative"] > 0
    plain = spec["without_speculation"]["paged"]
    assert doc["tpot_s"]["mean"] < plain["tpot_s"]["mean"]
    assert doc["generated_tokens"] == 30 * 300  # every output 300 tokens long


def test_plain_json_has_no_speculative_keys(run_cli):
    doc = run_cli("sim", *SMALL, "--json").json()
    assert "speculative" not in doc and "speculative" not in doc["memory"]


def test_compare_and_ngram_tables(run_cli):
    result = run_cli("sim", *SMALL, *SPEC, "--spec-method", "ngram", "--compare", "paged,reserve-oracle")
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    assert "paged, K = 4" in out and "reserve-oracle, plain" in out
    assert "speculative slots" in out and "n-gram drafting" in out
    doc = run_cli("sim", *SMALL, *SPEC, "--spec-method", "ngram", "--compare", "paged,reserve-oracle",
                  "--json").json()
    assert doc["speculative"]["lookahead_slots"] == 0 and doc["speculative"]["draft_cost"] == 0
    assert set(doc["speculative"]["without_speculation"]) == {"paged", "reserve-oracle"}
    assert doc["policies"]["reserve-oracle"]["speculative"]["steps"] > 0


@pytest.mark.parametrize("args,flag", [
    (("--spec-tokens", "4", "--spec-acceptance", "1.5"), "--spec-acceptance"),
    (("--spec-tokens", "4", "--spec-acceptance", "nan"), "--spec-acceptance"),
    (("--spec-tokens", "-2", "--spec-acceptance", "0.5"), "--spec-tokens"),
    (("--spec-acceptance", "0.5"), "--spec-acceptance"),
    (("--spec-tokens", "4"), "--spec-acceptance"),
    (("--spec-tokens", "3000", "--spec-acceptance", "0.5", "--max-batched-tokens", "4096"), "--spec-tokens"),
    (("--spec-tokens", "4", "--spec-acceptance", "0.5", "--policy", "reserve-max", "--rollback-policy", "free"),
     "--rollback-policy"),
    (("--spec-tokens", "4", "--spec-acceptance", "0.5", "--spec-method", "ngram", "--draft-cost", "0.2"),
     "--draft-cost"),
])
def test_bad_speculation_is_one_line(run_cli, args, flag):
    result = run_cli("sim", "--requests", "5", *args)
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and flag in lines[0], result.stderr
