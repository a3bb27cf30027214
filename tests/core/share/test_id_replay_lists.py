"""The replay on plain lists (core/share/id_replay_lists.py, no numpy) against `share_trace` on the same text: every
field of the result equal, or None exactly where `share_trace` raises an input error or evicts through its pool —
on random Mooncake files with prefix-chained ids and without (a small alphabet, where only the trie of whole id
sequences says what is equal), ids too few for a prompt's blocks, ties in arrival, block sizes valid and not,
capacities from too small to unlimited, and --limit. The real traces: tests/perf/test_share_perf.py (the CLI's
JSON against the package before either replay by ids existed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from kvcalc.core.inputs.trace_text import read_mooncake_lines
from kvcalc.core.inputs.traces import trace_of
from kvcalc.core.share.id_replay_lists import share_trace_lists
from kvcalc.core.share.replay import share_trace
from kvcalc.core.share.trace_blocks import check_trace


def id_sequences(shapes: list[tuple[int, int, list[int]]], counts: list[int], chained: bool) -> list[list[int]]:
    """Per request `counts[k]` ids. Chained: request k keeps the first `keep` ids of an earlier request, then
    fresh ids (an id then fixes its whole prefix). Not chained: `small` ids from {0..3}, then fresh ones."""
    out: list[list[int]] = []
    fresh = 100
    for k, ((earlier, keep, small), n) in enumerate(zip(shapes[: len(counts)], counts, strict=True)):
        start = (out[earlier % k][:keep] if k else []) if chained else small
        out.append((start + list(range(fresh, fresh + n)))[:n])
        fresh += n
    return out


def mooncake_text(rows: list[tuple[int, int, int, int]], ids: list[list[int]]) -> str:
    return "".join(json.dumps({"timestamp": t, "input_length": p, "output_length": o, "hash_ids": hs}) + "\n"
                   for (t, p, o, _), hs in zip(rows, ids, strict=True))


rows_strategy = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 5000), st.integers(0, 3000), st.integers(0, 9)),
                         min_size=1, max_size=25)
shapes_strategy = st.lists(st.tuples(st.integers(0, 50), st.integers(0, 10), st.lists(st.integers(0, 3), max_size=10)),
                           min_size=25, max_size=25)


@settings(max_examples=300, deadline=None)
@given(rows_strategy, shapes_strategy, st.booleans(),
       st.sampled_from([1, 8, 16, 64, 100, 128, 512, 1024, 1536, 2048, 2**31]),
       st.sampled_from([None, "unlimited", "unlimited+1", "largest", "largest-1", "0"]), st.sampled_from([None, 0, 3]))
def test_the_list_replay_equals_share_trace(rows: list, shapes: list, chained: bool, block_size: int,
                                            capacity: str | None, limit: int | None) -> None:
    """A row's last value 0 drops one of the ids its prompt needs (1 in 10: the error of a block without an id);
    capacity: none, or relative to the blocks that evict nothing (`unlimited`) or to the largest request."""
    counts = [-(-p // 512) - (1 if short == 0 and p >= 512 else 0) for _, p, _, short in rows]
    text = mooncake_text(rows, id_sequences(shapes, counts, chained))
    lines = read_mooncake_lines(text, "t.jsonl")
    trace = trace_of("mooncake", "t.jsonl", lines)
    cap = None
    try:
        trace = trace if limit is None else trace.head(limit)
        if capacity is not None:
            checked = check_trace(trace, block_size, None)
            cap = {"unlimited": checked.pool_blocks, "unlimited+1": checked.pool_blocks + 1, "0": 0,
                   "largest": checked.largest_blocks, "largest-1": checked.largest_blocks - 1}[capacity]
        expected = share_trace(trace, block_size, cap)
    except ValueError:  # ParameterError included: the general path names the error, the list path declines
        assert share_trace_lists(lines, "mooncake", "t.jsonl", block_size, cap, limit) is None
        return
    got = share_trace_lists(lines, "mooncake", "t.jsonl", block_size, cap, limit)
    if got is None:  # only where the pool may evict: a capacity at most the blocks that evict nothing
        assert cap is not None and expected.cached.pool_blocks == cap
    else:
        assert got == expected
        assert expected.cached.evictions == 0


def test_a_small_trace_replays_without_numpy(tmp_path: Path) -> None:
    """`kvcalc share --trace mooncake` on a small trace imports no numpy (its import takes longer than the
    replay), and prints what the replay through numpy prints (hits checked by hand: the second request hits the
    first's two full 512-token ids at block 512, 1,024 tokens; then ids 1, 2 and 4 are cached: 3 blocks)."""
    path = tmp_path / "small.jsonl"
    path.write_text(mooncake_text([(0, 1100, 5, 1), (10, 1600, 5, 1)], [[1, 2, 3], [1, 2, 4, 5]]))
    code = ("import sys; from kvcalc.cli.app import main; sys.argv = ['kvcalc', 'share', '--trace', 'mooncake', "
            f"{str(path)!r}, '--block', '512', '--json']\ntry:\n    main()\n"
            "except SystemExit as e:\n    assert not e.code\nassert 'numpy' not in sys.modules, 'numpy imported'")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert (doc["hit_tokens"], doc["hit_blocks"], doc["peak_cached_blocks"], doc["evictions"]) == (1024, 2, 3, 0)
    trace = trace_of("mooncake", str(path), read_mooncake_lines(path.read_text(), str(path)))
    assert share_trace(trace, 512) == share_trace_lists(read_mooncake_lines(path.read_text(), str(path)),
                                                        "mooncake", str(path), 512, None)
