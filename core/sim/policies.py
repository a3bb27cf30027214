"""Memory policies of the allocation ablation: where a running request's KV lives.

    paged           the real block pool (core.block_pool), block size B, prefix caching from Mooncake
                    hash_ids; blocks are taken when a request crosses a block boundary, so it can run
                    out mid-decode (then the scheduler preempts).
    reserve-max     one contiguous region of the model's max length, reserved at admission;
    reserve-pow2    ... of the next power of two of the request's true length (prompt + output);
    reserve-oracle  ... of exactly its true length (an oracle that knows the output length).
                    Reservations come from a first-fit allocator (core.sim_alloc), so external
                    fragmentation shows up; a reservation never grows, so these never preempt.

The policies live in core/sim_paged.py and core/sim_reserve.py and share one interface ("check, then
change"; the False-returning calls change nothing):

    never_fits(rid, total)                 reject at arrival (more KV than the whole pool)
    hit_tokens(rid, num_tokens)            prefix-cache hit of an admission (pure)
    can_admit / admit(rid, start, total)   memory for the first chunk (reservations: the whole region)
    grow_many(rids, totals) / grow         room for the next tokens of running requests
    release(rid, reason)                   the one release path (finished, cancelled, timed_out, preempted)
    decode_steps_available, segment_integrals, finish_segment
                                           the same accounting for fast-forwarded runs of steps
    parts(tokens, head)                    memory now, per MEMORY_PARTS (token slots; they sum to the pool)
    check_whole()                          after the run: nothing held, invariants hold

Memory is accounted in token slots of the pool, split into the parts of `MEMORY_PARTS`; block-table bytes
are reported beside them. The scheduler samples them every step.
"""

from __future__ import annotations

POLICIES = ("paged", "reserve-max", "reserve-pow2", "reserve-oracle")
MEMORY_PARTS = ("useful", "tail_fragmentation", "reservation_waste", "external_fragmentation", "cached_free", "free")
UNLIMITED_STEPS = 1 << 62

