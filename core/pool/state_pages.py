"""A state group's one page under mamba_cache_mode none, and the slots of state pages in a pool's accounting.

vLLM without prefix caching gives a Mamba / linear-attention group a block of max_model_len tokens, so a request
holds exactly one state page for its whole life, updated in place. The hybrid pool keeps every group's table one
entry a block of B tokens (the tables of a sequence have one length); a state group in mode none holds only the
table's last entry, and when the sequence grows into a new block its page moves there (`roll_page`): the same
physical block, no copy and no second page, unless a fork shares it (then the growing branch takes a copy, as
copy-on-write of any shared page). Mode align and all keep their pages (groups.PoolGroup.first_block).

A state page holds a state, not token slots: in usage its B slots are all useful (tail fragmentation is the
attention blocks' unused slots only). The store counts a block's written tokens (`fill`), so `state_slack` is the
correction: Σ over the distinct blocks the state groups hold of B − fill.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence

import numpy as np

from .append import SeqTable
from .pool_tables import NULL_BLOCK
from .store import BlockStore


def crosses(seq: SeqTable, num_tokens: int, block_size: int) -> bool:
    """Whether appending `num_tokens` to a sequence that holds tokens moves its running state into a new block."""
    old = seq.num_tokens
    return old > 0 and num_tokens > 0 and (old - 1) // block_size != (old + num_tokens - 1) // block_size


def roll_need(store: BlockStore, seq: SeqTable) -> int:
    """Free blocks `roll_page` takes: a copy of the page when another table holds it too (a fork), else none."""
    return int(store.ref[seq.table[seq.num_blocks - 1]] > 1)


def roll_page(store: BlockStore, seq: SeqTable, num_tokens: int, defer: bool = False
              ) -> tuple[int, list[tuple[int, int]]]:
    """Append `num_tokens` to a state table of mode none whose growth `crosses` into a new block: its page (the
    table's last entry, the only one it holds) moves to the new last entry with the state updated in place, or,
    shared, is copied there. Returns (table entries freed: the pages before it still held, the copies [(src, dst)]).
    `defer`: inside a step (the freed pages pending, as BlockPool.skip_blocks). The caller counts the pool's
    tokens and entries (logical_tokens += num_tokens, logical_blocks −= the freed) and staleness."""
    B, old = store.block_size, seq.num_tokens
    end = old + num_tokens
    last, page = (end - 1) // B, int(seq.table[seq.num_blocks - 1])
    freed = 0
    if seq.num_skipped < seq.num_blocks - 1:  # older pages still held (none holds one, but be exact)
        gone = seq.table[seq.num_skipped : seq.num_blocks - 1]
        store.ref[gone] -= 1
        store.drop(gone[store.ref[gone] == 0][::-1], defer=defer)
        freed = len(gone)
    fill = end - last * B
    copies: list[tuple[int, int]] = []
    if store.ref[page] > 1:  # a fork shares it: this branch's state is its own copy from now on
        dst = store.take_one(fill)
        store.ref[page] -= 1
        copies.append((page, dst))
        store.counters["cow_copies"] += 1
        page = dst
    else:
        store.useful_tokens += fill - int(store.fill[page])
        store.fill[page] = fill
    if last + 1 > len(seq.table):
        seq.table = np.concatenate([seq.table, np.empty(2 * (last + 1), dtype=np.int64)])
    seq.table[seq.num_skipped : last] = NULL_BLOCK  # entries it no longer holds, as skip_blocks leaves them
    seq.table[last] = page
    seq.num_skipped, seq.num_blocks, seq.num_tokens = last, last + 1, end
    return freed, copies


def state_slack(store: BlockStore, tables: Iterable[np.ndarray], shared: bool, weight: int = 1) -> int:
    """Σ weight · (B − fill) over the distinct blocks in `tables` (a state group's held pages, kept speculative
    pages): the slots a token count leaves unwritten in whole states. A block of a weighted table is `weight` units
    of B slots, and weighted usage counts its fill `weight` times (core/pool/weighted.py weighted_usage), so a
    state page counts weight · B slots, a whole state. `shared`: a block may be in two tables (forks, hits)."""
    parts = [t for t in tables if len(t)]
    if not parts:
        return 0
    blocks = np.concatenate(parts)
    if shared:
        blocks = np.unique(blocks)
    return weight * int(len(blocks) * store.block_size - np.add.reduce(store.fill[blocks], dtype=np.int64))


# ---- the page an align step that jumps over pages resumes from ---------------------------------------------------
# vLLM's MambaManager (mode align) records the last page a step's allocation found (last_state_block_idx: the state
# it resumes from) and frees it at the request's next remove_skipped_blocks, or at its release; a step that jumps
# over pages holds it besides the step's last page, with null entries between. The hybrid pool keeps its tables one
# held range, so such a page is held past the table: Resumed maps a sequence to {group: (table index, block)}, each
# one reference (HybridLayout._resume, _let_resumed_go).
Resumed = dict[Hashable, dict[int, tuple[int, int]]]


def resumed_blocks(resumed: Resumed, num_groups: int) -> list[np.ndarray]:
    """Per group, the pages held past the tables."""
    found: list[list[int]] = [[] for _ in range(num_groups)]
    for pages in resumed.values():
        for g, (_, block) in pages.items():
            found[g].append(block)
    return [np.array(blocks, dtype=np.int64) for blocks in found]


def with_resumed(resumed: Resumed, seq_id: Hashable, tables: list[np.ndarray]) -> list[np.ndarray]:
    """The sequence's block tables with the page each state group holds past its table at that page's entry, as
    vLLM's table names it until the next step."""
    for g, (at, block) in resumed.get(seq_id, {}).items():
        tables[g][at] = block
    return tables


def held_past(resumed: Resumed, seq_ids: Sequence[Hashable]) -> int:
    """Pages held past the tables of `seq_ids` (each one reference: let go at their next step)."""
    return sum(len(resumed[i]) for i in seq_ids if i in resumed) if resumed else 0


def jump_holds(computed: int, keep: int, total: int, block_size: int) -> bool:
    """Whether a state table of mode align, `computed` tokens written, that an append leaves holding its blocks
    from `keep` to `total` (groups.PoolGroup.first_block) holds the page it resumes from past the table: the
    append jumps (it keeps no page it holds now: keep > (computed − 1) // B) and keeps only its last page
    (weighted.state_jump: a step that ends past a boundary mid-block keeps that boundary's page instead)."""
    return computed > 0 and keep == total - 1 and keep > (computed - 1) // block_size


def held_counts(resumed: Resumed, seq_id: Hashable, seqs: Sequence[dict[Hashable, SeqTable]]) -> list[int]:
    """Blocks each group (its pool's `seqs`) holds for the sequence: the table's held range and a page past it."""
    pages = resumed.get(seq_id, {})
    return [t[seq_id].num_blocks - t[seq_id].num_skipped + (g in pages) for g, t in enumerate(seqs)]
