"""A walk through the KV block pool that `share`, `sim` (and later `verify`) run on.

Run: python examples/pool_walkthrough.py

A pool of 8 blocks of 4 token slots. A 10-token prompt is allocated, forked into two branches (parallel
sampling), both branches decode one token — the shared, partly filled last block is copied first
(copy-on-write) — then everything is released and a second request with the same prompt hits the prefix
cache. `check_invariants()` runs after every operation.
"""

from __future__ import annotations

from kvcalc.core.pool.block_pool import BlockPool, ReleaseReason

BLOCK_SIZE = 4
PROMPT = list(range(100, 110))  # 10 token ids: blocks [100..103], [104..107] are full, [108, 109] is partial


def full_block_keys(tokens: list[int]) -> list[tuple[int, ...]]:
    """One content key per full block: the block's token ids."""
    return [tuple(tokens[i : i + BLOCK_SIZE]) for i in range(0, len(tokens) - BLOCK_SIZE + 1, BLOCK_SIZE)]


def show(pool: BlockPool, what: str, *seqs: str) -> None:
    pool.check_invariants()
    tables = "  ".join(f"{s}={pool.block_table(s).tolist()}" for s in seqs if pool.has_seq(s))
    usage = pool.usage()
    print(
        f"{what:<44} {tables:<26} used={usage.used_blocks} free={usage.free_blocks} "
        f"(of which cached={usage.cached_free_blocks})"
    )


def main() -> None:
    pool = BlockPool(num_blocks=8, block_size=BLOCK_SIZE)

    hits = pool.allocate("a", len(PROMPT), full_block_keys(PROMPT))
    show(pool, f"allocate prompt a (10 tokens, {hits} hit)", "a")

    pool.fork("a", "b")
    show(pool, "fork a -> b (blocks shared, ref 2)", "a", "b")

    copies = pool.append("b", 1)
    show(pool, f"b decodes 1 token: copy-on-write {copies}", "a", "b")

    copies = pool.append("a", 1)
    show(pool, f"a decodes 1 token: copies {copies}", "a", "b")

    pool.release("b", ReleaseReason.FINISHED)
    pool.release("a", ReleaseReason.CANCELLED)
    show(pool, "release b (finished), a (cancelled)")

    hits = pool.allocate("c", len(PROMPT), full_block_keys(PROMPT))
    show(pool, f"allocate the same prompt as c: {hits} hit", "c")

    pool.release("c", ReleaseReason.FINISHED)
    show(pool, "release c: the pool is whole again")
    stats = pool.stats()
    print(f"copy-on-write copies: {stats.cow_copies}")


if __name__ == "__main__":
    main()
