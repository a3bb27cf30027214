"""Per KV cache group, what `kvcalc sim`'s lower tiers hold, what a hit needs of them and what a load reads
(core/sim/tiers.py), as vLLM's offloading connector does on a hybrid model (its scheduler side,
distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py, the HMA version: GroupOffloadSpec, offload keys
make_offload_key(block hash, group), _lookup / _sliding_window_lookup / update_state_after_alloc):

    what a tier holds   each group's block of a position on its own (one entry per group: the class c of the
                        tier's CachedBlockBytes.groups), written when a request computes it (tiers_store)
    a hit of h blocks   after g GPU hits needs, in a tier, each group's blocks from lookup_first(h) to h − 1:
        full            every block g..h−1 (_maximal_prefix_lookup)
        sliding W       the last cdiv(W, B) (_sliding_window_lookup: that many consecutive hits ending at h;
                        a run from g shorter than that is enough, the GPU hit holding the rest of the window)
        state           the one at h − 1 (a Mamba group looks up a window of one block)
        chunked C       the current chunk's blocks (first_needed). vLLM's connector has no rule of its own for
                        ChunkedLocalAttentionSpec: the version read looks it up as full attention, a later one
                        asserts FullAttentionSpec; kvcalc keeps the GPU pool's rule (the blocks a hit reads)
    a load reads        each group's blocks from GroupBytes.first_needed(h) on (vLLM's null entries before:
                        update_state_after_alloc loads only the non-null pending blocks)

sim's host is written through as vLLM's CPU tier is (tiers_store): a block the GPU still caches is a tier hit only
where the tier holds it too.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..errors import ParameterError
from ..pool.groups import PoolGroup
from ..share.cache_bytes import GroupBytes

HOST, DISK, ABSENT = 0, 1, -1


def lookup_first(group: GroupBytes, hit_blocks: np.ndarray, block_size: int) -> np.ndarray:
    """The first block a hit of `hit_blocks` blocks needs of `group` in a tier (module docstring)."""
    n = np.asarray(hit_blocks, dtype=np.int64)
    if group.kind == "sliding":
        assert group.window is not None
        return np.maximum(n - -(-group.window // block_size), 0)
    return group.first_needed(n, block_size)


def group_classes(classes: Sequence[GroupBytes], groups: Sequence[PoolGroup]) -> np.ndarray:
    """int64 [len(groups)]: the tier class (index in `classes`) of each pool group: its kind and window."""
    out = []
    for g in groups:
        match = [c for c, gb in enumerate(classes) if gb.kind == g.kind and gb.window == g.window]
        if len(match) != 1:
            raise ParameterError(f"host_cache/disk_cache: the pool's {g.name} group matches {len(match)} of the "
                                 f"tier's byte groups ({', '.join(gb.label for gb in classes)}): not modelled yet",
                                 "host_cache", "disk_cache")
        out.append(match[0])
    return np.array(out, dtype=np.int64)


def touch_window(group: GroupBytes, block_size: int) -> int:
    """How many blocks before a request's first hit end its touches keep of `group` (vLLM's _touch: a sliding
    window's cdiv(W, B), a state group's one; full and chunked groups every block: a bound past any hit)."""
    if group.kind == "sliding":
        assert group.window is not None
        return -(-group.window // block_size)
    return 1 if group.kind == "state" else 1 << 62


def find(where: tuple[dict[int, int], dict[int, int]], keys: list[int], classes: Sequence[GroupBytes]) -> np.ndarray:
    """int8 [C, K]: where each class's block of positions keys[0..K) is (HOST, DISK, ABSENT), from the host's and
    the disk's entries (`where`; the host's first when both hold it). K ends at the first position whose full
    group blocks are in neither; without a full group it is len(keys)."""
    C = len(classes)
    host, disk = where
    if C == 1 and classes[0].kind == "full":  # a plain model: one entry a position, up to the first in neither
        row = []
        for k in keys:
            t = HOST if k in host else DISK if k in disk else ABSENT
            if t == ABSENT:
                break
            row.append(t)
        return np.array([row], dtype=np.int8).reshape(1, len(row))
    full = [c for c, gb in enumerate(classes) if gb.kind == "full"]
    n = K = len(keys)
    if full:
        K = 0
        while n > K and all(keys[K] * C + c in host or keys[K] * C + c in disk for c in full):
            K += 1
    out = np.full((C, K), ABSENT, dtype=np.int8)
    for c in range(C):
        for i in range(K):
            e = keys[i] * C + c
            out[c, i] = HOST if e in host else DISK if e in disk else ABSENT
    return out


def valid_loads(found: np.ndarray, classes: Sequence[GroupBytes], gpu_blocks: int, block_size: int) -> np.ndarray:
    """bool [K + 1]: which k a load may take (k = 0 always): every class holds what a hit of gpu_blocks + k
    needs (lookup_first on)."""
    K = found.shape[1]
    k = np.arange(K + 1)
    ok = np.ones(K + 1, dtype=bool)
    for c, gb in enumerate(classes):
        missing = np.zeros(K + 1, dtype=np.int64)
        missing[1:] = np.cumsum(found[c] == ABSENT)
        lo = np.clip(lookup_first(gb, gpu_blocks + k, block_size) - gpu_blocks, 0, k)
        ok &= missing[k] == missing[lo]
    return ok


def read_counts(found: np.ndarray, classes: Sequence[GroupBytes], gpu_blocks: int, block_size: int,
                ks: np.ndarray) -> np.ndarray:
    """int64 [C, 2, len(ks)]: per class, the blocks a load of the first k positions reads from the host and from
    the disk (its blocks from first_needed(gpu_blocks + k) on), for each k in `ks`."""
    K = found.shape[1]
    out = np.zeros((len(classes), 2, len(ks)), dtype=np.int64)
    for c, gb in enumerate(classes):
        start = np.clip(gb.first_needed(gpu_blocks + ks, block_size) - gpu_blocks, 0, ks)
        for t in (HOST, DISK):
            cum = np.zeros(K + 1, dtype=np.int64)
            cum[1:] = np.cumsum(found[c] == t)
            out[c, t] = cum[ks] - cum[start]
    return out


def position_tiers(found: np.ndarray, classes: Sequence[GroupBytes], gpu_blocks: int, block_size: int,
                   k: int) -> np.ndarray:
    """int8 [k]: where each loaded position's hit came from, for the per-tier hit counts: DISK when any group's
    block read there came from the disk, else HOST."""
    disk = np.zeros(k, dtype=bool)
    for c, gb in enumerate(classes):
        start = int(np.clip(gb.first_needed(np.int64(gpu_blocks + k), block_size) - gpu_blocks, 0, k))
        disk[start:] |= found[c, start:k] == DISK
    return np.where(disk, DISK, HOST).astype(np.int8)
