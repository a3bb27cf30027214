"""Speculative slots: k temporary positions past a sequence's committed tokens, of which verification
accepts the first j; the other k − j are rolled back. `BlockPool.reserve` / `commit` check and count;
this module does the store side and holds the per-sequence state.

One step as the pool sees it. The scheduler reserves every position the step writes — in vLLM's terms the
last sampled token, K drafts and K lookahead positions, 1 + 2K = 5 for K = 2 — and commits what
verification accepted (the last sampled token and one draft here). B = 4, C = 6 committed tokens:

    before            |0 1 2 3|4 5 . .|
    reserve(seq, 5)   |0 1 2 3|4 5 6 7|8 9 10 .|     slots 6..10: the partial block fills up, one more block
    commit(seq, 2)    6, 7 accepted; 8..10 rolled back
        keep  (vLLM v1)   |0 1 2 3|4 5 6 7| [8 9 10 .]   the block stays the sequence's (kept): the next
                                                        step writes its slots again; no block is freed
        free  (SGLang)    |0 1 2 3|4 5 6 7|              the block wholly past the committed length is freed

Rules (`check_speculative`, which BlockPool.check_invariants calls, asserts those about state):

* While a reservation is open the block table covers C + k slots (the verification pass writes the drafts'
  KV there): `num_tokens` is C + k, `committed_tokens` is C. Appending to or forking such a sequence is
  refused; so is a second reserve.
* A reservation is consumed exactly once: by `commit`, or by `release` (cancel, finish, preempt), which
  returns every block the sequence holds — committed, reserved and kept. A second commit raises.
* Drafted positions are never hashed: `reserve` takes no block keys; `commit` registers only the blocks
  its committed tokens fill. No hash covers a position at or past the committed length.
* Kept blocks (policy keep) are held past the block table, in position order, ref 1 and empty: the next
  reserve — or append, which is a reserve committed whole — writes into them before taking free blocks.
  They count as the sequence's logical blocks, as they do in vLLM's block table.
* After a commit, allocated − committed slots of a sequence (B · blocks held − C):
      free   <= B − 1            the tail of its last block, as without speculation
      keep   <= k_max + B − 1    k_max: the largest reservation since the sequence last held no kept
                                 block. Kept blocks never reach past the longest reservation, and the
                                 committed length only grows; a scheduler that reserves the same k every
                                 step keeps allocated − committed <= k + B − 1.
* A failed reserve changes nothing (PoolExhaustedError; ask `can_reserve` first).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from ..blocks import ceil_div
from ..errors import ParameterError
from .append import SeqTable, completed_keys, copy_last_block, register_completed
from .prefix_lookup import PrefixIndex
from .store import BlockKeys, BlockStore, PoolExhaustedError

ROLLBACK_POLICIES = ("keep", "free")
DEFAULT_ROLLBACK_POLICY = "keep"  # vLLM v1's

_NO_BLOCKS = np.empty(0, dtype=np.int64)
_NO_BLOCKS.flags.writeable = False


def check_rollback_policy(policy: str) -> str:
    if policy not in ROLLBACK_POLICIES:
        raise ParameterError(
            f"rollback_policy {policy!r} is not a rollback policy: use 'keep' (vLLM v1: rejected slots stay the "
            "sequence's and are written again next step) or 'free' (SGLang: blocks wholly past the committed "
            "length are freed)", "rollback_policy",
        )
    return policy


@dataclass(frozen=True)
class Reservation:
    """An open reservation: `num_slots` temporary slots after the `committed` tokens of a sequence."""

    committed: int
    num_slots: int


@dataclass(frozen=True)
class SpeculativeUsage:
    """Speculative slots at one moment.

    reserved_slots      slots of open reservations (drafts, lookahead) not yet committed or rolled back
    speculative_blocks  blocks that hold no committed token: the blocks of open reservations wholly past
                        the committed length, plus kept blocks (policy keep)
    """

    open_reservations: int
    reserved_slots: int
    speculative_blocks: int
    kept_blocks: int


@dataclass(frozen=True)
class SpeculativeStats:
    """Counters since the pool was created (an append into kept blocks is not a reservation)."""

    reservations: int = 0
    reserved_slots: int = 0
    accepted_slots: int = 0
    rolled_back_slots: int = 0
    freed_blocks: int = 0  # policy free: blocks a rollback gave back
    rewritten_blocks: int = 0  # policy keep: kept blocks written again


class SpeculativeSlots:
    """The speculative state of one pool's sequences — open reservations, kept blocks — and the store side
    of `BlockPool.reserve`, `commit`, and of append and release on such sequences (see the module). Each
    operation checks, then changes; the pool keeps its own counters from what they return."""

    def __init__(self, store: BlockStore, prefix: PrefixIndex, policy: str = DEFAULT_ROLLBACK_POLICY) -> None:
        self.store = store
        self.prefix = prefix
        self.policy = check_rollback_policy(policy)
        self.reservations: dict[Hashable, Reservation] = {}
        self.kept: dict[Hashable, np.ndarray] = {}  # int64 [m] per sequence, in position order
        self.max_slots: dict[Hashable, int] = {}  # the k_max of the keep bound, while kept blocks exist
        self.counters = dict.fromkeys(SpeculativeStats.__dataclass_fields__, 0)

    @property
    def tracked(self) -> bool:
        """Some sequence has an open reservation or kept blocks (the pool's fast paths skip it otherwise)."""
        return bool(self.reservations) or bool(self.kept)

    def tracks(self, seq_id: Hashable) -> bool:
        return seq_id in self.reservations or seq_id in self.kept

    def committed(self, seq_id: Hashable, seq: SeqTable) -> int:
        res = self.reservations.get(seq_id)
        return seq.num_tokens if res is None else res.committed

    def refuse_reserved(self, seq_ids: Iterable[Hashable], what: str) -> None:
        if self.reservations:
            for seq_id in seq_ids:
                if seq_id in self.reservations:
                    raise ValueError(f"sequence {seq_id!r} has an open reservation and cannot be {what}: commit "
                                     "or release it first")

    # ---- reserve, commit --------------------------------------------------------------------------
    def need(self, seq_id: Hashable, seq: SeqTable, num_slots: int, copy: bool) -> int:
        """Free blocks `num_slots` (>= 1) more slots take: the blocks past the table that kept ones do not
        cover, plus the copy of a shared partial last block (`copy`, which the pool decides)."""
        grow = max(ceil_div(seq.num_tokens + num_slots, self.store.block_size) - seq.num_blocks, 0)
        kept = self.kept.get(seq_id, _NO_BLOCKS)
        return grow - min(grow, len(kept)) + copy

    def reserve(self, seq_id: Hashable, seq: SeqTable, num_slots: int, copy: bool) -> tuple[list[tuple[int, int]], int]:
        """Open a reservation of `num_slots` slots; returns (the CoW copies, the fresh blocks the table took)."""
        if num_slots < 0:
            raise ValueError(f"cannot reserve a negative number of slots ({num_slots})")
        self.refuse_reserved([seq_id], "reserved again")
        result = self.grow(seq_id, seq, num_slots, copy)
        self.reservations[seq_id] = Reservation(seq.num_tokens - num_slots, num_slots)
        self.counters["reservations"] += 1
        self.counters["reserved_slots"] += num_slots
        return result

    def commit(
        self, seq_id: Hashable, seq: SeqTable, num_accepted: int, block_keys: BlockKeys, *, defer: bool
    ) -> tuple[int, int]:
        """Settle the open reservation: keep the first `num_accepted` slots, roll the rest back; returns
        (slots rolled back, blocks freed — policy free; `defer`: pending until the running step ends)."""
        res = self.reservations.get(seq_id)
        if res is None:
            raise ValueError(f"sequence {seq_id!r} has no open reservation: a reservation is committed once")
        if not 0 <= num_accepted <= res.num_slots:
            raise ValueError(f"num_accepted {num_accepted} is outside 0..{res.num_slots}, the reserved slots")
        committed = res.committed + num_accepted
        keys = completed_keys(self.prefix, seq, res.committed, committed, block_keys)
        del self.reservations[seq_id]
        tail = self._truncate(seq, committed)
        freed = 0
        if self.policy == "keep":
            self._keep(seq_id, tail, res.num_slots)
        elif len(tail):
            self.store.ref[tail] = 0
            self.store.drop(tail[::-1], 0, defer=defer)
            freed = len(tail)
        register_completed(self.prefix, seq, keys)
        rolled_back = res.num_slots - num_accepted
        counters = self.counters
        counters["accepted_slots"] += num_accepted
        counters["rolled_back_slots"] += rolled_back
        counters["freed_blocks"] += freed
        return rolled_back, freed

    def append(
        self, seq_id: Hashable, seq: SeqTable, num_tokens: int, block_keys: BlockKeys, copy: bool
    ) -> tuple[list[tuple[int, int]], int]:
        """`BlockPool.append` to a sequence this tracks: refused while reserved; otherwise written through
        its kept blocks first (a reservation committed whole). Returns (copies, fresh blocks)."""
        self.refuse_reserved([seq_id], "appended to")
        keys = completed_keys(self.prefix, seq, seq.num_tokens, seq.num_tokens + num_tokens, block_keys)
        result = self.grow(seq_id, seq, num_tokens, copy)
        register_completed(self.prefix, seq, keys)
        return result

    def release(self, seq_id: Hashable, *, defer: bool) -> int:
        """The sequence is released: drop its reservation (its slots are in the table, which the pool drops
        next) and its kept blocks (the tail: first, as release drops a table tail first). Returns how many
        kept blocks were dropped."""
        self.reservations.pop(seq_id, None)
        self.max_slots.pop(seq_id, None)
        kept = self.kept.pop(seq_id, _NO_BLOCKS)
        if len(kept):
            self.store.ref[kept] = 0
            self.store.drop(kept[::-1], 0, defer=defer)
        return len(kept)

    # ---- the store side ---------------------------------------------------------------------------
    def grow(self, seq_id: Hashable, seq: SeqTable, num_slots: int, copy: bool) -> tuple[list[tuple[int, int]], int]:
        """Check, then give `seq` `num_slots` more slots: copy the shared partial last block first when
        `copy`, fill it, then the kept blocks, then fresh ones. Returns (copies [(src, dst)], fresh blocks)."""
        if num_slots == 0:
            return [], 0
        store, B, old = self.store, self.store.block_size, seq.num_tokens
        need = self.need(seq_id, seq, num_slots, copy)
        if need > len(store.queue):
            raise PoolExhaustedError(f"{num_slots} slots need {need} blocks, {len(store.queue)} free")
        copies: list[tuple[int, int]] = []
        if old % B:
            last = int(seq.table[seq.num_blocks - 1])
            if copy:
                last = copy_last_block(store, seq, last, copies)
            added = min(B - old % B, num_slots)
            store.fill[last] += added
            store.useful_tokens += added
        new_total = ceil_div(old + num_slots, B)
        grow = new_total - seq.num_blocks
        seq.num_tokens = old + num_slots
        if grow <= 0:
            return copies, 0
        if new_total > len(seq.table):
            seq.table = np.concatenate([seq.table, np.empty(2 * new_total, dtype=np.int64)])
        in_new = old + num_slots - seq.num_blocks * B  # slots that land past the old table
        kept = self.kept.pop(seq_id, _NO_BLOCKS)
        reused = kept[:grow]
        if len(kept) > grow:
            self.kept[seq_id] = kept[grow:]
        else:
            self.max_slots.pop(seq_id, None)
        if len(reused):
            fills = np.full(len(reused), B, dtype=store.fill.dtype)
            fills[-1] = min(B, in_new - (len(reused) - 1) * B)
            store.fill[reused] = fills
            store.useful_tokens += int(fills.sum())
            self.counters["rewritten_blocks"] += len(reused)
        start, fresh = seq.num_blocks, grow - len(reused)
        seq.table[start : start + len(reused)] = reused
        if fresh:
            seq.table[start + len(reused) : new_total] = store.take(fresh, in_new - len(reused) * B)
        seq.num_blocks = new_total
        return copies, fresh

    def _truncate(self, seq: SeqTable, num_tokens: int) -> np.ndarray:
        """Cut `seq` back to its first `num_tokens` slots (rolled-back slots hold nothing); returns the blocks
        wholly past them (ref 1, now empty), which the caller keeps or frees."""
        store, B = self.store, self.store.block_size
        keep = ceil_div(num_tokens, B)
        tail = seq.table[keep : seq.num_blocks].copy()
        if keep > seq.num_skipped:  # (a layer group may have freed the block already: then it was full)
            store.fill[seq.table[keep - 1]] = num_tokens - (keep - 1) * B
        store.fill[tail] = 0
        store.useful_tokens -= seq.num_tokens - num_tokens
        seq.num_blocks, seq.num_tokens = keep, num_tokens
        return tail

    def _keep(self, seq_id: Hashable, tail: np.ndarray, num_slots: int) -> None:
        """Policy keep: `tail` becomes the first of the sequence's kept blocks (ahead of those not rewritten)."""
        rest = self.kept.get(seq_id, _NO_BLOCKS)
        if not len(tail) and not len(rest):
            return
        self.kept[seq_id] = np.concatenate([tail, rest]) if len(rest) else tail
        self.max_slots[seq_id] = max(self.max_slots.get(seq_id, 0), num_slots)

    # ---- reading ----------------------------------------------------------------------------------
    def usage(self, seqs: Mapping[Hashable, SeqTable]) -> SpeculativeUsage:
        B = self.store.block_size
        past = sum(seqs[s].num_blocks - ceil_div(r.committed, B) for s, r in self.reservations.items())
        kept = sum(len(k) for k in self.kept.values())
        return SpeculativeUsage(
            open_reservations=len(self.reservations),
            reserved_slots=sum(r.num_slots for r in self.reservations.values()),
            speculative_blocks=past + kept,
            kept_blocks=kept,
        )

    def stats(self) -> SpeculativeStats:
        return SpeculativeStats(**self.counters)


def check_speculative(slots: SpeculativeSlots, seqs: Mapping[Hashable, SeqTable]) -> None:
    """Raise AssertionError naming the first broken rule of the module docstring (the pool checks the
    rest — reference counts, fills, counters — with kept blocks as held blocks)."""
    store, B = slots.store, slots.store.block_size
    hashed = store.hashed
    for seq_id, res in slots.reservations.items():
        seq = seqs.get(seq_id)
        assert seq is not None, f"a reservation outlived its sequence {seq_id!r}"
        assert seq.num_tokens == res.committed + res.num_slots, "a reservation disagrees with its table"
    for seq_id, kept in slots.kept.items():
        assert seq_id in seqs, f"kept blocks outlived their sequence {seq_id!r}"
        assert slots.policy == "keep", "a rollback kept blocks under policy free"
        assert len(kept) and not hashed[kept].any(), "a kept block is hashed"
        assert np.all(store.ref[kept] == 1), "a kept block is shared"
    for seq_id, seq in seqs.items():
        committed = slots.committed(seq_id, seq)
        assert seq.num_hashed * B <= committed, "a hash covers a position at or past the committed length"
        assert not hashed[seq.table[committed // B : seq.num_blocks]].any(), \
            "a hash covers a position at or past the committed length"
        if seq_id in slots.reservations:
            continue
        slack = B * (seq.num_blocks + len(slots.kept.get(seq_id, _NO_BLOCKS))) - seq.num_tokens
        bound = slots.max_slots[seq_id] + B - 1 if seq_id in slots.kept else B - 1
        assert slack <= bound, f"sequence {seq_id!r} holds {slack} slots past its committed length, bound {bound}"
