"""The prefix cache's logic over the block store: content keys, their chain hashes, the verified look-up of
a prompt's cached prefix, and the registration of full blocks. `BlockPool` holds one `PrefixIndex` next to
its `BlockStore` and calls it.

    keys        one int64 per full block (object keys are interned to exact ids; one kind per pool)
    hashes      chained from the extra key's root (prefix_cache), with home slots in the hash index
    look-up     the index's `find` of every key (the misses' free slots are kept for registration), then
                verification of the candidates up to the first miss: the same key, chained after the
                block just matched at the same version (or the root); a hit never covers the block of
                the last prompt token (see BlockPool.allocate)
    register    the fresh full blocks with keys go into the index; a block whose content is cached already
                joins that entry as a duplicate (vLLM caches every full block it computes)

A replay hashes many prompts at once (`hash_prompts`); their look-ups then run 32 prompts at a time and
are checked per prompt against the index as it is (see `_find`).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import NamedTuple

import numpy as np

from .free_queue import FREE_CACHED
from .hash_index import EMPTY
from .prefix_cache import HashedKeys, HashedPrompts, chain_hashes, chain_hashes_batch, root_hash
from .store import BlockKeys, BlockStore

GivenKeys = Sequence[Hashable] | np.ndarray | HashedKeys  # BlockKeys once None (no keys) is ruled out

_ROOT = np.array([-1], dtype=np.intp)
_LOOKAHEAD_PROMPTS = 32  # prompts of a hashed batch looked up at once (see _find)
_KEPT_PROBES = 8  # look-ups kept while the index is unchanged (see probe)
_NO_IDS = np.empty(0, dtype=np.intp)
_NO_IDS.flags.writeable = False
_NO_HASHES = np.empty(0, dtype=np.uint64)
_NO_HASHES.flags.writeable = False


class Probe(NamedTuple):
    """A prompt's look-up: its verified hits, and what registering its other full blocks needs."""

    hits: np.ndarray  # intp [h]: the cached blocks of the prompt's first h full blocks
    hashes: np.ndarray  # uint64 [k]: chain hashes of the prompt's k keyed blocks
    keys: np.ndarray  # int64 [k]
    homes: np.ndarray  # int64 [k]: home slots in the hash index
    present: np.ndarray  # intp [k]: the block indexed under each hash, or -1 (the index's `find`)
    slots: np.ndarray  # int64 [k]: where each hash lives, or the free slot that ended its probe run
    extra_id: int


NO_PROBE = Probe(_NO_IDS, _NO_HASHES, _NO_IDS, _NO_IDS, _NO_IDS, _NO_IDS, 0)  # a prompt without keys


class PrefixIndex:
    """Content keys, hashing, look-up and registration over a `BlockStore` (see the module docstring)."""

    def __init__(self, store: BlockStore) -> None:
        self.store = store
        self.index = store.index
        self._key_kind: str | None = None  # "int" or "object", fixed by the first keys seen
        self._interned: dict[Hashable, int] = {}
        self._extras: dict[Hashable, int] = {None: 0}
        self._lookahead: tuple | None = None  # see _find
        self._probes_at: int | None = None  # the index's epoch of the kept look-ups (see probe)
        self._probes: list[tuple] = []  # (tokens, extra key, keys, *_kept(look-up)), the latest first

    # ---- content keys and their hashes ----------------------------------------------------------
    def hash_prompts(self, block_keys: np.ndarray, offsets: np.ndarray, extra_key: Hashable = None) -> HashedPrompts:
        """Chain hashes and home slots of many prompts' block keys at once (vectorised over all of them).

        block_keys int64 [K]: the prompts' keys end to end; offsets int64 [N+1]: prompt i's keys are
        block_keys[offsets[i]:offsets[i+1]]. `.prompt(i)` is what `allocate` takes as its block_keys.
        """
        if not isinstance(block_keys, np.ndarray):
            raise ValueError("hash_prompts takes block keys as one int64 array (object keys: pass them per prompt)")
        keys = self.key_array(block_keys)
        offsets = np.asarray(offsets, dtype=np.int64)
        lengths = np.diff(offsets)
        if len(offsets) < 1 or offsets[0] != 0 or offsets[-1] != len(keys) or np.any(lengths < 0):
            raise ValueError(f"offsets must rise from 0 to {len(keys)} (the number of keys), one more than prompts")
        hashes = chain_hashes_batch(root_hash(self.extra_id(extra_key)), keys, offsets)
        position = np.arange(len(keys), dtype=np.int64) - np.repeat(offsets[:-1], lengths)
        line_base = np.arange(len(keys), dtype=np.int64) - (position & 15)  # see HashIndex: one line per 16
        homes = self.index.home_slots(hashes[line_base], position)
        return HashedPrompts(keys, hashes, homes, offsets, extra_key, self.index)

    def key_array(self, block_keys: GivenKeys) -> np.ndarray:
        """int64 [k]: the keys as exact integers (an int array as it is, object keys interned)."""
        if isinstance(block_keys, HashedKeys):
            raise ValueError("keys from hash_prompts are a prompt's: give them to allocate, serve or hit_tokens")
        kind = "int" if isinstance(block_keys, np.ndarray) else "object"
        if self._key_kind is None:
            self._key_kind = kind
        elif self._key_kind != kind:
            raise ValueError(f"this pool takes {self._key_kind} block keys; do not mix int64 arrays and objects")
        if isinstance(block_keys, np.ndarray):
            if block_keys.dtype.kind not in "iu":
                raise ValueError(f"block keys as an array must be integers, got dtype {block_keys.dtype}")
            return block_keys.astype(np.int64, copy=False)
        interned = self._interned
        return np.fromiter((interned.setdefault(k, len(interned)) for k in block_keys), np.int64, len(block_keys))

    def extra_id(self, extra_key: Hashable) -> int:
        return self._extras.setdefault(extra_key, len(self._extras))

    def _prompt_hashes(
        self, block_keys: GivenKeys, extra_key: Hashable
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        """(keys int64 [k], chain hashes uint64 [k], home slots int64 [k], extra-key id) of a prompt."""
        extra_id = self.extra_id(extra_key)
        if isinstance(block_keys, HashedKeys):
            batch = block_keys.batch
            if batch.index is not self.index:
                raise ValueError("these hashed keys were computed by another pool: use this pool's hash_prompts")
            if batch.extra_key != extra_key:
                raise ValueError(f"keys hashed for extra key {batch.extra_key!r}, allocated with {extra_key!r}")
            return block_keys.keys, block_keys.hashes, block_keys.homes, extra_id
        keys = self.key_array(block_keys)
        hashes = chain_hashes(root_hash(extra_id), keys)
        positions = np.arange(len(keys))
        return keys, hashes, self.index.home_slots(hashes[positions & ~15], positions), extra_id

    # ---- prefix look-up -------------------------------------------------------------------------
    def probe(self, num_tokens: int, block_keys: GivenKeys, extra_key: Hashable) -> Probe:
        """The look-up of a prompt of `num_tokens` whose first full blocks have `block_keys` (not None). The last
        few look-ups of int keys are kept until the index's entries move or a chain is relinked (`epoch`), and
        re-checked where the index changed since (`_recheck`): a waiting prompt is looked up again at every step
        it waits, and a step's inserts and evictions touch few of its blocks."""
        if not isinstance(block_keys, np.ndarray):
            return self._probe_now(num_tokens, block_keys, extra_key)
        if self._probes_at != self.index.epoch:
            self._probes_at, self._probes = self.index.epoch, []
        for i, kept in enumerate(self._probes):
            tokens, extra, keys = kept[:3]
            if tokens == num_tokens and len(keys) == len(block_keys) and extra == extra_key and np.array_equal(
                    keys, block_keys):
                return self._recheck(i)
        for i, kept in enumerate(self._probes):  # a kept look-up of a longer prompt with these first keys
            tokens, extra, keys = kept[:3]
            if tokens >= num_tokens and len(keys) >= len(block_keys) and extra == extra_key and np.array_equal(
                    keys[: len(block_keys)], block_keys):
                return self._prefix_probe(self._recheck(i), num_tokens, len(block_keys))
        result = self._probe_now(num_tokens, block_keys, extra_key)
        self._probes = [(num_tokens, extra_key, block_keys.copy(), *self._kept(result)),
                        *self._probes[:_KEPT_PROBES - 1]]
        return result

    def _kept(self, result: Probe) -> tuple[Probe, tuple[int, int], np.ndarray, np.ndarray]:
        """(the look-up, the index's (generation, num_live) now, what each key's slot holds now — its block, or
        EMPTY where the key is absent —, the found blocks' versions now): what `_recheck` compares."""
        index, present = self.index, result.present
        return (result, (index.generation, index.num_live), np.where(present >= 0, present, EMPTY),
                self.store.version.take(np.maximum(present, 0)))

    def _recheck(self, i: int) -> Probe:
        """Kept look-up i, made the index's `find` of now again (same epoch: no entry moved, no chain relinked).

        A key found in block b at slot s is found there still while s holds b and b's version is the same (b was
        not handed out, so neither re-hashed nor re-chained); a key absent up to the empty slot s is absent still
        while s is empty (an insert of the key would have taken s, the first free slot of its run; a delete leaves
        a tombstone, never an empty slot). Only keys where that fails are looked up again. The verified hits follow
        from the finds: keys, parents and versions change only with a hand-out (a changed version) or a relink (a
        new epoch)."""
        tokens, extra, keys, result, at, expected, versions = self._probes[i]
        index, store = self.index, self.store
        if at == (index.generation, index.num_live):  # nothing inserted or deleted since
            return result
        present, slots = result.present, result.slots
        stale = index.vals.take(slots) != expected
        if at[0] != index.generation:  # deletions since: a found block may have been handed out (evicted) since
            stale |= (store.version.take(np.maximum(present, 0)) != versions) & (present >= 0)
        if not np.count_nonzero(stale):  # NOTE: not stale.any(), a Python-level wrapper
            self._probes[i] = (tokens, extra, keys, result, (index.generation, index.num_live), expected, versions)
            return result
        redo = np.flatnonzero(stale)
        present, slots = present.copy(), slots.copy()
        present[redo], slots[redo] = index.find(result.hashes[redo], result.homes[redo])
        result = self._verified(tokens, result.keys, result.hashes, result.homes, present, slots, result.extra_id)
        self._probes[i] = (tokens, extra, keys, *self._kept(result))
        return result

    def _prefix_probe(self, longer: Probe, num_tokens: int, k: int) -> Probe:
        """The look-up of a prompt of `num_tokens` whose k keys begin a longer prompt's, from that one's (`_probe_now`
        on the same index): its hashes, homes and finds are the first k (a chain hash and its home slot depend on the
        blocks before it only), and its verified hits the longer one's up to its own most hit blocks (verification
        goes block by block from the first: a prefix of the chain verifies alike)."""
        if k > num_tokens // self.store.block_size:
            raise ValueError(f"{k} block keys for a {num_tokens}-token prompt, which has only "
                             f"{num_tokens // self.store.block_size} full blocks of {self.store.block_size}")
        most = min(k, max(num_tokens - 1, 0) // self.store.block_size)
        return Probe(longer.hits[:most], longer.hashes[:k], longer.keys[:k], longer.homes[:k], longer.present[:k],
                     longer.slots[:k], longer.extra_id)

    def _probe_now(self, num_tokens: int, block_keys: GivenKeys, extra_key: Hashable) -> Probe:
        B = self.store.block_size
        keys, hashes, homes, extra_id = self._prompt_hashes(block_keys, extra_key)
        if len(keys) > num_tokens // B:
            raise ValueError(
                f"{len(keys)} block keys for a {num_tokens}-token prompt, which has only "
                f"{num_tokens // B} full blocks of {B}"
            )
        if not len(keys):  # a prompt shorter than a block: nothing to look up (a third of them at block 4,096)
            return Probe(_NO_IDS, hashes, keys, homes, _NO_IDS, _NO_IDS, extra_id)
        present, slots = self._find(hashes, homes, block_keys)  # all: allocate inserts misses without a 2nd look
        return self._verified(num_tokens, keys, hashes, homes, present, slots, extra_id)

    def _verified(self, num_tokens: int, keys: np.ndarray, hashes: np.ndarray, homes: np.ndarray,
                  present: np.ndarray, slots: np.ndarray, extra_id: int) -> Probe:
        """The look-up of a prompt of `num_tokens` with these keys (at least one) from the index's `find` of them."""
        max_hit = min(len(keys), max(num_tokens - 1, 0) // self.store.block_size)
        cand = present[:max_hit]
        # verify only up to the first block not in the index: a hole ends the chain, whatever follows it
        # (a miss is -1, which as a block id would read the last block: it must never reach verification)
        if max_hit:
            first_miss = int(cand.argmin())  # block ids are >= 0: the first minimum is the first miss, if any
            if cand[first_miss] < 0:
                cand = cand[:first_miss]
        num_hit = self._verified_hits(cand, keys, extra_id) if len(cand) else 0
        return Probe(cand[:num_hit], hashes, keys, homes, present, slots, extra_id)

    def _find(self, hashes: np.ndarray, homes: np.ndarray, block_keys: BlockKeys) -> tuple[np.ndarray, np.ndarray]:
        """The index's `find` of a prompt's hashes: (present block ids intp [k] or -1, slots int64 [k]).

        For a prompt of a hashed batch, the look-up runs for the next _LOOKAHEAD_PROMPTS prompts at once (a
        few numpy calls over thousands of keys instead of a few dozen per prompt) and each prompt's part is
        checked against the index as it is now. Without deletions (no tombstone, no eviction, no rebuild)
        an entry found stays where it is, and a hash absent up to an empty slot stays absent while that
        slot is empty: the only inserts since went into empty slots, and an insert of the hash itself
        would have taken that slot, the first free one on its probe run. Keys whose slot changed are
        looked up again.
        """
        index = self.index
        if not isinstance(block_keys, HashedKeys) or index.num_tombstones:
            return index.find(hashes, homes)
        batch, number = block_keys.batch, block_keys.number
        ahead = self._lookahead
        if ahead is None or ahead[0] is not batch or not ahead[1] <= number < ahead[2] or ahead[3] != index.generation:
            stop = min(number + _LOOKAHEAD_PROMPTS, len(batch))
            a, b = int(batch.offsets[number]), int(batch.offsets[stop])
            present, slots = index.find(batch.hashes[a:b], batch.homes[a:b])
            expected = np.where(present >= 0, present, EMPTY)  # what each slot holds while still valid
            ahead = self._lookahead = (batch, number, stop, index.generation, a, present, slots, expected)
        a = block_keys.start - ahead[4]
        b = a + len(hashes)
        present, slots = ahead[5][a:b], ahead[6][a:b]
        stale = index.vals.take(slots) != ahead[7][a:b]
        if np.count_nonzero(stale):  # NOTE: not stale.any(), a Python-level wrapper: this runs once a request
            redo = np.flatnonzero(stale)
            present, slots = present.copy(), slots.copy()
            present[redo], slots[redo] = index.find(hashes[redo], homes[redo])
        return present, slots

    def _verified_hits(self, cand: np.ndarray, keys: np.ndarray, extra_id: int) -> int:
        """How many leading candidates (block ids intp [m], all indexed) hold the prompt's content: the
        same key, after the content of the candidate before (its class) or the root."""
        store, m = self.store, len(cand)
        root = int(cand[0])
        if store.parent_klass[root] != -1 - extra_id or store.key[root] != keys[0]:
            return 0
        if m == 1:
            return 1
        rest = cand[1:]
        ok = store.key.take(rest) == keys[1:m]
        ok &= store.parent_klass.take(rest) == store.klass.take(cand[:-1])
        first_bad = int(ok.argmin())  # the first False, or 0 when all are True
        return m if ok[first_bad] else 1 + first_bad

    # ---- registration ---------------------------------------------------------------------------
    def register_prompt(self, table: np.ndarray, probe: Probe, evicted: bool) -> np.ndarray | None:
        """Index the prompt's keyed blocks past its hits, table[len(hits) : len(keys)] (just handed out);
        `evicted`: blocks were evicted since the probe. Returns which were indexed (bool), None when all."""
        num_hits = len(probe.hits)
        present = probe.present[num_hits:]
        if evicted:
            present = self._present_after_evictions(present, probe.slots[num_hits:])
        rest = slice(num_hits, None)
        return self._register(table, num_hits, probe.extra_id, probe.hashes[rest], probe.keys[rest],
                              probe.homes[rest], present, probe.slots[rest])

    def register_continuation(
        self, table: np.ndarray, first: int, extra_id: int, parent_hash: int, keys: np.ndarray
    ) -> int:
        """Index the full blocks table[first : first + len(keys)] that an append completed, chained after
        block first - 1 (whose hash is `parent_hash`); returns the last block's hash."""
        hashes = chain_hashes(parent_hash, keys)
        positions = first + np.arange(len(hashes))
        base = positions & ~15  # a line's base block may be one of the blocks before `first`
        in_batch = base >= first
        earlier = self.store.block_hash[table[np.minimum(base, first)]]
        base_hashes = np.where(in_batch, hashes[np.maximum(base - first, 0)], earlier)
        self._register(table, first, extra_id, hashes, keys, self.index.home_slots(base_hashes, positions))
        return int(hashes[-1])

    def _present_after_evictions(self, present: np.ndarray, slots: np.ndarray) -> np.ndarray:
        """A look-up's present block ids [k] (or -1), made right again after evictions since it ran: an evicted
        block's entry passed to the next block of its content (dup_lists), or is gone — its slot a tombstone on the
        hash's probe run, a valid place to insert the hash again. Nothing else changes on a deletion."""
        gone = (present >= 0) & (self.store.block_slot.take(np.maximum(present, 0)) < 0)
        if not np.count_nonzero(gone):
            return present
        now = self.index.vals.take(slots)
        return np.where(gone, np.where(now >= 0, now, -1), present)

    def _register(self, table: np.ndarray, first: int, extra_id: int, hashes: np.ndarray, keys: np.ndarray,
                  homes: np.ndarray, present: np.ndarray | None = None, slots: np.ndarray | None = None,
                  ) -> np.ndarray | None:
        """Register the full blocks table[first : first + len(keys)] (just written, ref 1) under their hashes;
        returns which were registered (bool [k]), or None when all of them were.

        A block whose content is cached (the entry under its hash holds the same key after the same content) joins
        that entry, behind the blocks there, and takes its class; the others get new classes and entries of their
        own (an entry in the way under the hash — stale, after content no block holds any more, or a 64-bit hash
        collision — is dropped first: a look-up could never verify it). Past the first new class no content can be
        cached any more (nothing is after a new class), so the joins are a leading run. A block after a block that
        holds no content (unhashed) is not registered. `present, slots`: the index's `find` of these hashes, when
        the caller has it (saves a probe).
        """
        store, index, count = self.store, self.index, len(keys)
        blocks = table[first : first + count]
        if first:
            before = int(table[first - 1])
            if before < 0 or store.block_slot[before] < 0:
                return np.zeros(count, dtype=bool)
            parent0 = int(store.klass[before])
        else:
            parent0 = -1 - extra_id
        if present is None or slots is None:
            present, slots = index.find(hashes, homes)
        if np.maximum.reduce(present) < 0:  # nothing cached under these hashes (a replay's common case)
            num_join, klass = 0, store.new_classes(count)
        else:
            num_join, klass = _join_classes(store, present, keys, parent0)
        store.block_hash[blocks] = hashes
        store.block_home[blocks] = homes
        store.key[blocks] = keys
        store.klass[blocks] = klass
        parents = np.roll(klass, 1)
        parents[0] = parent0
        store.parent_klass[blocks] = parents
        if num_join:
            index.join(present[:num_join], blocks[:num_join])
        if num_join == count:
            return None
        new = slice(num_join, None)
        present, slots = present[new], slots[new]
        if np.maximum.reduce(present) >= 0:  # entries in the way (see above)
            present = drop_in_the_way(self.store, present)
        inserted = index.insert_absent(hashes[new], blocks[new], homes[new], present, slots)
        anchored = index.anchored
        if anchored is not None and anchored.ghosts:  # contents cached anew: their ghost rows back (anchored_map)
            anchored.revive(blocks[new] if inserted is None else blocks[new][inserted])
        if inserted is None:
            return None
        out = np.ones(count, dtype=bool)
        out[num_join:] = inserted
        return out


def _join_classes(store: BlockStore, present: np.ndarray, keys: np.ndarray, parent0: int) -> tuple[int, np.ndarray]:
    """(how many leading blocks join a cached content, the class of each [k]) of blocks with these keys after the
    content of class `parent0`, from the index's `find` of their hashes (`present`: the entries' blocks, or -1)."""
    count = len(keys)
    cand = np.maximum(present, 0)
    match = present >= 0
    match &= store.key.take(cand) == keys
    expected = np.empty(count, dtype=np.int64)  # the class each block's content comes after, if all joined
    expected[0] = parent0
    expected[1:] = store.klass.take(cand[:-1])
    match &= store.parent_klass.take(cand) == expected
    num_join = count if match.all() else int(match.argmin())
    klass = np.empty(count, dtype=np.int64)
    klass[:num_join] = store.klass.take(cand[:num_join])
    klass[num_join:] = store.new_classes(count - num_join)
    return num_join, klass


def drop_in_the_way(store: BlockStore, present: np.ndarray) -> np.ndarray:
    """Drop the entries of `present` (block ids, or -1) whose blocks are all free (each becomes a plain free block);
    returns `present` with those -1 (their slots, now tombstones, take the new blocks). An entry in the way of a
    new block under its hash is stale (after content no block holds any more: no look-up can verify it) or a 64-bit
    hash collision; one a table holds stays (verified content: the new block stays unindexed)."""
    index = store.index
    heads = present[present >= 0]
    free = store.state.take(heads) == FREE_CACHED
    members, owners = index.dups.grouped(heads)
    if len(members):
        busy = np.unique(owners[store.state.take(members) != FREE_CACHED])
        free &= ~np.isin(heads, busy)
    if not np.count_nonzero(free):
        return present
    dropped = index.drop_entries(heads[free])
    store.queue.uncache(dropped)
    store.fill[dropped] = 0
    return np.where(np.isin(present, heads[free]), -1, present)
