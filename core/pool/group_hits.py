"""Prefix-cache hits of the layer groups that keep no whole chain: sliding W, chunked C, and a state group under
mamba_cache_mode align (vLLM v1's SlidingWindowManager / ChunkedLocalAttentionManager / MambaManager
`find_longest_cache_hit`, re-derived).

A full group serves a hit of h blocks when its blocks 0..h−1 are cached: a chain, verified block by block
(prefix_lookup). The other groups' layers read less, so a hit needs less of them: only the blocks from the first
one the next token reads, first(h), to h − 1:

    kind          first(h), the hit at token hB         needs cached
    sliding W     max(0, hB − W + 1) // B               the blocks covering the last W − 1 tokens of the prefix
    chunked C     ⌊hB / C⌋·C // B                       the current chunk's blocks (none when hB is a multiple of C)
    state align   h − 1                                 the page saved at exactly boundary hB

(first(h) is the group's `first_block` with hB tokens computed: what its table would hold there anyway.)
Their blocks before first(h) may be long evicted, so their own chain cannot verify them. Each such block is
anchored instead to the content of the full group's block at the same position: registered after that content's
class (store.parent_klass), under the index entry's block of it (the anchor) and a hash derived from its chain
hash. The full group's verified chain says the prompt's prefix 0..i is the content of its block F_i (the entry's
block: the earliest cached copy); a group block registered after F_i's class was written by a sequence with that
same prefix. So a hit is exact, as a chain's, and a look-up is one `find` per group over the full group's hit
positions.

    h (blocks)        0  1  2  3  4  5  6           B 4, W 9: first(h) = max(0, 4h − 8) // 4 = h − 2
    sliding cached    .  .  x  .  x  x  .           (x: an anchored block at that position)
    serves h?         y  n  n  n  n  y  n           h = 5 needs blocks 3, 4: no; h = 6 needs 4, 5: yes

`valid_hits` gives, for every h up to the full group's hit, whether the group serves it; the pool's hit is the
largest h that every group serves (vLLM's coordinator iterates the groups to the same fixed point).

A state page in mode align is saved where a step ends at, or (prefill split at block boundaries, vLLM's
`_mamba_block_aligned_split`) passes, a block boundary: after a step ends at n tokens, page n // B − 1 holds
the state at boundary (n // B)·B. Pages inside a longer step hold no saved state and are never registered.

Several blocks may hold one group's block of one content (duplicates, as vLLM caches them): registered under the
index entry's block of the anchor's content, the first found by a look-up, the others behind it (dup_lists).
"""

from __future__ import annotations

import numpy as np

from .anchored_map import AnchoredMap
from .groups import PoolGroup
from .prefix_cache import mix64
from .store import BlockStore

_SALT, _SUB_SALT = 0xD6E8FEB86659FD93, 0xA0761D6478BD642F


def derived_hashes(anchor_hashes: np.ndarray, groups: int | np.ndarray, subs: np.ndarray | None = None) -> np.ndarray:
    """uint64 [n]: the hash a group's anchored block is indexed under, from its anchor's chain hash (`groups`: the
    group of each, or one for all; `subs`: which of the group's blocks inside its anchor block, where the group's
    blocks are smaller than the anchor's — mixed block sizes, group_blocks; none: 0)."""
    salt = (np.atleast_1d(np.asarray(groups, dtype=np.uint64)) + np.uint64(1)) * np.uint64(_SALT)  # wraps mod 2^64
    if subs is not None:
        salt = salt + subs.astype(np.uint64) * np.uint64(_SUB_SALT)
    return mix64(anchor_hashes ^ salt)


def anchor_positions(positions: np.ndarray, block_tokens: int, anchor_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """(the anchor's block, the sub-index inside it) of a group's blocks at `positions` when the group's blocks hold
    `block_tokens` and the anchor's `anchor_tokens` (mixed block sizes): a block is anchored to the full group's
    block that holds its last token, whose verified chain covers the block's whole prefix. Equal sizes: (i, 0)."""
    if block_tokens == anchor_tokens:
        return positions, np.zeros_like(positions)
    anchors = ((positions + 1) * block_tokens - 1) // anchor_tokens
    return anchors, positions - anchors * anchor_tokens // block_tokens


def anchored_lookup(store: BlockStore, group: int, positions: np.ndarray, anchors: np.ndarray, subs: np.ndarray,
                    anchor_hashes: np.ndarray) -> np.ndarray:
    """intp [n]: group's cached block at each of `positions` (its anchor block ids `anchors`, their chain hashes
    `anchor_hashes`, sub-indices `subs`: anchor_positions), or -1 — anchored_present for one group of mixed size."""
    if not len(positions):
        return np.empty(0, dtype=np.intp)
    hashes = derived_hashes(anchor_hashes, group, subs)
    found, _ = store.index.find(hashes, store.index.home_slots(hashes, positions))
    cand = np.maximum(found, 0)
    ok = (found >= 0) & (store.klass.take(cand) == store.parent_klass.take(anchors))
    ok &= store.key.take(cand) == store.key.take(anchors)
    return np.where(ok, found, -1)


def first_needed(group: PoolGroup, hits: np.ndarray, block_size: int) -> np.ndarray:
    """int64 [n]: first(h) of the module docstring for each hit length h (blocks) in `hits`."""
    B, tokens = block_size, hits * block_size
    if group.kind == "sliding":
        return np.maximum(tokens - group.span + 1, 0) // B
    if group.kind == "chunked":
        return tokens // group.span * group.span // B
    if group.kind == "state":
        return np.maximum(hits - 1, 0)
    return np.zeros_like(hits)


def first_needed_at(group: PoolGroup, hit: int, block_size: int) -> int:
    """first_needed of one hit length `hit` (blocks), in plain ints."""
    B, tokens = block_size, hit * block_size
    if group.kind == "sliding":
        return max(tokens - group.span + 1, 0) // B
    if group.kind == "chunked":
        return tokens // group.span * group.span // B
    if group.kind == "state":
        return max(hit - 1, 0)
    return 0


def anchored_present(store: BlockStore, groups: list[int], anchor_hits: np.ndarray,
                     anchor_hashes: np.ndarray, start: int = 0) -> np.ndarray:
    """intp [len(groups), h]: each group's cached block at each of the full group's verified hit positions, or -1
    (one look-up for all the groups); `anchor_hits` and `anchor_hashes` are those of positions start..start + h.
    Groups of one block size register in the anchored map (anchored_map): looked up there, through the anchors."""
    h = len(anchor_hits)
    anchored = _map(store)
    if not store.index.map_anchored:
        positions = np.arange(start, start + h)
        return np.array([anchored_lookup(store, g, positions, anchor_hits, np.zeros(h, dtype=np.int64),
                                         anchor_hashes) for g in groups], dtype=np.intp).reshape(len(groups), h)
    if not h or anchored is None:
        return np.full((len(groups), h), -1, dtype=np.intp)
    return anchored.present(np.asarray(groups, dtype=np.intp), anchor_hits).reshape(len(groups), h)


def valid_hits(group: PoolGroup, present: np.ndarray, block_size: int) -> np.ndarray:
    """bool [h + 1]: whether the group serves a hit of 0..h blocks, given its `present` blocks [h]."""
    count = np.concatenate(([0], np.cumsum(present >= 0)))
    hits = np.arange(len(present) + 1)
    first = first_needed(group, hits, block_size)
    return count[hits] - count[first] == hits - first


def valid_token_hits(group: PoolGroup, present: np.ndarray, block_tokens: int, hits: np.ndarray) -> np.ndarray:
    """bool [len(hits)]: whether the group, of `block_tokens` tokens per block, serves each hit of `hits` tokens
    (each a whole number of its blocks), given its `present` blocks: valid_hits for mixed block sizes."""
    count = np.concatenate(([0], np.cumsum(present >= 0)))
    blocks = hits // block_tokens
    first = first_needed(group, blocks, block_tokens)
    return count[blocks] - count[first] == blocks - first


def hit_table(group: PoolGroup, present: np.ndarray, hit: int, block_size: int) -> np.ndarray:
    """intp [hit]: the group's hit blocks for a hit of `hit` blocks, -1 before the first one it reads."""
    first = first_needed_at(group, hit, block_size)
    table = np.full(hit, -1, dtype=np.intp)
    table[first:hit] = present[first:hit]
    return table


def register_anchored(store: BlockStore, groups: np.ndarray, blocks: np.ndarray, anchors: np.ndarray,
                      positions: np.ndarray, subs: np.ndarray | None = None) -> int:
    """Register full `blocks` of anchored `groups` (the group of each) at chain `positions`, each anchored to the
    content of the full group's block at the same position (`anchors`; with mixed block sizes the one that holds
    its last token, `subs` its sub-index there: anchor_positions): under the index entry's block of that content
    (the anchor itself, or the earlier copy of its content, dup_lists). Blocks whose anchor is not indexed stay
    unregistered. One block size: in the anchored map (anchored_map), else in the index; a block of content
    registered already follows it as a duplicate, as vLLM caches it too. Returns how many were registered."""
    heads = store.index.head_of(np.maximum(anchors, 0))
    ok = (blocks >= 0) & (anchors >= 0) & (heads >= 0)
    ok &= store.block_slot.take(np.maximum(blocks, 0)) < 0
    blocks, heads, positions, groups = blocks[ok], heads[ok], positions[ok], groups[ok]
    if subs is not None:
        subs = subs[ok]
    if not len(blocks):
        return 0
    index = store.index
    hashes = derived_hashes(store.block_hash.take(heads), groups, subs)
    homes = index.home_slots(hashes, positions)
    store.block_hash[blocks] = hashes
    store.block_home[blocks] = homes
    _chain(store, blocks, heads)
    anchored = _map(store)
    if anchored is None:
        anchored = AnchoredMap(store, int(groups.max()) + 1)
        index.anchored = anchored
    anchored.grow(int(groups.max()) + 1)
    if subs is None and index.map_anchored:
        anchored.add(groups, blocks, heads)
        return len(blocks)
    present, slots = index.find(hashes, homes)
    cand = np.maximum(present, 0)
    same = (present >= 0) & (store.klass.take(cand) == store.parent_klass.take(heads))
    same &= store.key.take(cand) == store.key.take(heads)
    if np.count_nonzero(same):
        index.join(present[same], blocks[same])
        rest = ~same
        hashes, blocks, homes, present, slots = hashes[rest], blocks[rest], homes[rest], present[rest], slots[rest]
    if len(blocks) and np.maximum.reduce(present) >= 0:
        # an entry in the way is stale: after a content no full block holds any more (a 64-bit collision aside).
        # Its blocks stay cached, reached by no look-up, as the anchored map's rows of such content (anchored_map)
        index.drop_entries(present[present >= 0], orphan=True)
        present = np.full(len(present), -1, dtype=np.intp)
    inserted = index.insert_absent(hashes, blocks, homes, present, slots)
    return int(np.count_nonzero(ok)) - (0 if inserted is None else int(np.count_nonzero(~inserted)))


def _map(store: BlockStore) -> AnchoredMap | None:
    """The store's anchored map, None before its first block is registered."""
    anchored = store.index.anchored
    assert anchored is None or isinstance(anchored, AnchoredMap)
    return anchored


def _chain(store: BlockStore, blocks: np.ndarray, heads: np.ndarray) -> None:
    """Registered anchored `blocks` come after their anchors' content (`heads`: the index entries' blocks of it):
    its class (parent_klass), and what makes it that content whatever its class — the anchors' key (key) after
    their parent content (klass), which a look-up through the index compares (anchored_lookup: a class dies with
    its last block, the content comes back under a new one)."""
    store.key[blocks] = store.key.take(heads)
    store.klass[blocks] = store.parent_klass.take(heads)
    store.parent_klass[blocks] = store.klass.take(heads)
