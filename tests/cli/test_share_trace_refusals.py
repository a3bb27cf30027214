"""`kvcalc share --trace` on a hybrid: an input the replay refuses prints only its one `error:` line, no
'replaying …' announcement before it (core/share/replay_groups.replay_pool runs every refusal first)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

# request 2's ids (7, 1) put id 1 after another id than request 1's (1 first): not prefix-chained, so a block of
# Nemotron-H-56B's 4,128 tokens (vLLM's forced block) keyed by one id would not be exact
ROWS = [(0, 9000, [1]), (5, 9000, [7, 1])]


@pytest.mark.parametrize(("layout", "says"), [
    ("vllm", "not prefix-chained"),  # refused by check_keys_exact
    # align on the ideal layout runs (weighted tables, as vLLM pages states): block 16 tiles the ids, 1 id is too few
    ("ideal", "9000 prompt tokens need 18 hash_ids"),
])
def test_refused_replay_prints_one_error_line(run_cli, tmp_path: Path, layout: str, says: str) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": t, "input_length": p, "output_length": 3, "hash_ids": ids})
                             + "\n" for t, p, ids in ROWS))
    result = run_cli("share", "--trace", "mooncake", str(trace), "--model", "nemotron-h-56b", "--memory", "80GiB",
                     "--mamba-cache-mode", "align", "--layout", layout)
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert says in lines[0]
