"""The reservation memory policies: one contiguous region per request, reserved at admission from a
first-fit allocator (alloc.py) — `reserve-max`, `reserve-pow2`, `reserve-oracle`. See policies.py for the
interface the scheduler uses."""

from __future__ import annotations

import numpy as np

from ..pool.block_pool import ReleaseReason
from .alloc import FirstFitAllocator
from .policies import POLICIES, UNLIMITED_STEPS


class ReservationPolicy:
    """Contiguous reservation at admission from a first-fit allocator over the same number of slots."""

    exact_block_tables = False  # regions, not blocks
    releases_in_segment = True

    def __init__(self, name: str, capacity_slots: int, prompt: np.ndarray, output: np.ndarray, max_model_len: int):
        assert name in POLICIES[1:], f"not a reservation policy: {name}"
        self.name = name
        self.block_size = 1
        self.capacity_slots = capacity_slots
        self.alloc = FirstFitAllocator(capacity_slots)
        true_len = prompt + output
        if name == "reserve-max":
            self.reserved = np.full(len(prompt), max_model_len, dtype=np.int64)
        elif name == "reserve-pow2":
            self.reserved = (1 << np.ceil(np.log2(true_len)).astype(np.int64)).astype(np.int64)
            self.reserved = np.where(self.reserved < true_len, self.reserved * 2, self.reserved)
        else:
            self.reserved = true_len.astype(np.int64)
        self.held = np.zeros(len(prompt), dtype=np.int64)  # slots reserved by a live request, 0 otherwise

    def never_fits(self, rid: int, total_tokens: int) -> bool:
        return int(self.reserved[rid]) > self.capacity_slots

    def hit_tokens(self, rid: int, num_tokens: int) -> int:
        return 0

    def can_admit(self, rid: int, start_tokens: int, total_tokens: int, from_swap: bool = False) -> bool:
        return self.alloc.can_allocate(int(self.reserved[rid]))

    def admit(self, rid: int, start_tokens: int, total_tokens: int, from_swap: bool = False) -> bool:
        length = int(self.reserved[rid])
        assert total_tokens <= length, f"request {rid} needs {total_tokens} slots beyond its reservation {length}"
        if not self.alloc.allocate(rid, length):
            return False
        self.held[rid] = length
        return True

    def grow_many(self, rids: np.ndarray, totals: np.ndarray, new_blocks: int | None = None,
                  check: bool = True) -> bool:
        """Reservations cover the whole request: growth never needs memory (asserted when `check`)."""
        assert not check or np.all(totals <= self.held[rids]), "a request outgrew its reservation"
        return True

    def grow(self, rid: int, total: int) -> bool:
        assert total <= self.held[rid], f"request {rid} outgrew its reservation"
        return True

    def decode_steps_available(self, tokens: np.ndarray) -> tuple[int, None]:
        return UNLIMITED_STEPS, None

    def release(self, rid: int, reason: ReleaseReason) -> None:
        self.alloc.release(rid, reason)
        self.held[rid] = 0

    def fork(self, parent: int, child: int) -> None:
        raise ValueError(f"parallel samples share blocks through forks: use the paged policy, not {self.name}")

    def block_table(self, rid: int) -> np.ndarray:
        raise AssertionError(f"{self.name} reserves contiguous regions: there are no block tables")

    def take_copies(self) -> list[tuple[int, int]]:
        return []

    def _external(self, head_rid: int | None) -> int:
        if head_rid is None:
            return 0
        return self.alloc.free_in_holes_smaller_than(int(self.reserved[head_rid]))

    def parts(self, tokens: np.ndarray, head_rid: int | None) -> tuple[np.ndarray, int]:
        useful = int(tokens.sum())
        used = self.alloc.used_slots
        external = self._external(head_rid)
        parts = np.array([useful, 0, used - useful, external, 0, self.alloc.free_slots - external], dtype=np.int64)
        return parts, 0

    def segment_integrals(self, tokens: np.ndarray, plan: np.ndarray | None, d: np.ndarray, head_rid: int | None,
                          plan_steps: np.ndarray) -> tuple[np.ndarray, float, int]:
        """Σ_j d_j · parts_j over decode steps: only useful (T0 + n·s) moves; reservations stay put."""
        D, DS = float(d.sum()), float(d @ plan_steps[1 : len(d) + 1])
        useful = int(tokens.sum()) * D + len(tokens) * DS
        external = self._external(head_rid)
        parts = np.array([useful, 0.0, self.alloc.used_slots * D - useful, external * D, 0.0,
                          (self.alloc.free_slots - external) * D])
        return parts, 0.0, 0

    def finish_segment(self, rids: np.ndarray, tokens: np.ndarray, remaining: np.ndarray, d: np.ndarray,
                       useful: np.ndarray) -> tuple[int, np.ndarray, float]:
        """As PagedPolicy.finish_segment; regions never grow, so every step fits; a leaving request's region
        is free from the step after its last. Nobody waits in such a run: no external fragmentation."""
        k = len(d)
        alive = np.arange(k, dtype=np.int64)[None, :] < remaining[:, None]
        other = self.alloc.used_slots - int(self.reserved[rids].sum())  # regions of requests not in this run
        used = other + self.reserved[rids] @ alive
        parts = np.array([float(d @ useful), 0.0, float(d @ (used - useful)), 0.0, 0.0,
                          float(d @ (self.capacity_slots - used))])
        return k, parts, 0.0

    def check_whole(self) -> None:
        self.alloc.check_whole()
