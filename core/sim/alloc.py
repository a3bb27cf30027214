"""A contiguous first-fit allocator over token slots: the memory of the reservation baselines.

Systems before paging (FasterTransformer, Orca) gave each request one contiguous KV region at admission.
Regions of different sizes come and go, so free memory splits into holes; a request whose region fits
in the total free space but in no single hole is turned away. That is external fragmentation, and it is
why the baselines in the vLLM paper's Figure 2 lose memory beyond their over-reservation.

    slots: |--A--|.....|----B----|..|--C--|..........|
                 hole 0          hole 1   hole 2 (largest)

Holes are kept sorted by offset and merged with their neighbours on release; with at most a few hundred
live regions a Python list is faster than any tree. Every release goes through `release`, which refuses a
double free; `check_invariants` verifies that regions and holes tile the slots exactly.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from ..pool.block_pool import ReleaseReason


@dataclass
class FirstFitAllocator:
    """`capacity_slots` token slots; `regions[owner] = (offset, length)`; `holes` sorted [(offset, length)]."""

    capacity_slots: int
    regions: dict[int, tuple[int, int]] = field(default_factory=dict)
    holes: list[tuple[int, int]] = field(default_factory=list)
    releases: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.capacity_slots < 1:
            raise ValueError(f"allocator capacity must be at least one slot, got {self.capacity_slots}")
        self.holes = [(0, self.capacity_slots)]
        self.free_slots = self.capacity_slots

    @property
    def used_slots(self) -> int:
        return self.capacity_slots - self.free_slots

    def free_in_holes_smaller_than(self, length: int) -> int:
        """Free slots that a region of `length` cannot use (external fragmentation for that request)."""
        return sum(h for _, h in self.holes if h < length)

    def can_allocate(self, length: int) -> bool:
        return any(h >= length for _, h in self.holes)

    def allocate(self, owner: int, length: int) -> bool:
        """First fit: the lowest-offset hole that holds `length`; False (nothing changes) when none does."""
        assert owner not in self.regions, f"owner {owner} already holds a region"
        assert length >= 1, f"a region needs at least one slot, got {length}"
        for i, (offset, size) in enumerate(self.holes):
            if size >= length:
                if size == length:
                    del self.holes[i]
                else:
                    self.holes[i] = (offset + length, size - length)
                self.regions[owner] = (offset, length)
                self.free_slots -= length
                return True
        return False

    def release(self, owner: int, reason: ReleaseReason | str) -> int:
        """The one release path: returns the region's slots (their count) to the holes, merging neighbours."""
        reason = ReleaseReason(reason).value  # an unknown reason raises ValueError
        if owner not in self.regions:
            raise AssertionError(f"double free: owner {owner} holds no region")
        offset, length = self.regions.pop(owner)
        region_slots = length
        self.free_slots += length
        i = bisect.bisect_left(self.holes, (offset, 0))
        if i > 0 and sum(self.holes[i - 1]) == offset:
            i -= 1
            offset, length = self.holes[i][0], self.holes[i][1] + length
            del self.holes[i]
        if i < len(self.holes) and offset + length == self.holes[i][0]:
            length += self.holes[i][1]
            del self.holes[i]
        self.holes.insert(i, (offset, length))
        self.releases[reason] = self.releases.get(reason, 0) + 1
        return region_slots

    def check_invariants(self) -> None:
        """Regions and holes tile [0, capacity) exactly, holes are merged, free counts agree."""
        spans = sorted([*self.regions.values(), *self.holes])
        cursor = 0
        for offset, length in spans:
            assert length > 0 and offset == cursor, f"gap or overlap at slot {cursor} (next span {offset}+{length})"
            cursor += length
        assert cursor == self.capacity_slots, f"spans cover {cursor} of {self.capacity_slots} slots"
        for (a, la), (b, _) in zip(self.holes, self.holes[1:], strict=False):
            assert a + la < b, f"holes at {a} and {b} should have been merged"
        assert self.free_slots == sum(h for _, h in self.holes), "free slot count disagrees with the holes"

    def check_whole(self) -> None:
        """After every request has ended: no region left, one hole of the whole capacity."""
        self.check_invariants()
        assert not self.regions, f"{len(self.regions)} regions still held after the run"
        assert self.holes == [(0, self.capacity_slots)], f"allocator not whole: holes {self.holes[:4]}"
