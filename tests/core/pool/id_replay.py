"""An independent prefix-cache replay at the hash-id level, in plain Python (no numpy, no kvcalc code):
what the block pool's prefix cache must give on a Mooncake-style trace with unlimited capacity.

Requests run one at a time; every full prompt block stays cached (nothing is ever evicted). A request's
ids form a path in a trie (node = (parent node, id)), so equal paths are equal content whatever the ids'
own prefix chaining. Each node records how many of its id's 512 tokens are covered by cached blocks (block
B <= 512: full blocks end at multiples of B inside an id; B = m · 512: a block ends at every m-th id and
covers all of it). A prompt of n tokens hits its leading cached blocks, at most (n - 1) // B of them (the
block of the last prompt token is always recomputed). Every full block a request computes is cached (vLLM caches a
duplicate of a cached content too, e.g. that recomputed last block): full blocks - hit blocks of each. The walk
is per id, not per block: 282 k steps for the whole Mooncake conversation trace at any block size.
"""

from __future__ import annotations

ID_TOKENS = 512


def id_replay(requests: list[tuple[int, list[int]]], block_size: int) -> tuple[int, int, int]:
    """(hit tokens, hit blocks, cached blocks at the end) of replaying (prompt tokens, hash ids) requests."""
    B = block_size
    assert ID_TOKENS % B == 0 or B % ID_TOKENS == 0, B
    per_block = max(B // ID_TOKENS, 1)  # ids a block spans (B >= 512)
    trie: dict[tuple[int, int], int] = {}
    covered: list[int] = []  # node -> tokens of its id covered by cached blocks (0 .. 512)
    hit_blocks = cached_blocks = 0
    for prompt, ids in requests:
        full = prompt // B  # full blocks; their tokens lie in the first ceil(full · B / 512) ids
        full_ids = -(-full * B // ID_TOKENS)
        max_hit = min(full, max(prompt - 1, 0) // B)
        node, hit, path = -1, None, []
        for p in range(full_ids):
            node = trie.setdefault((node, ids[p]), len(trie))
            if node == len(covered):
                covered.append(0)
            path.append(node)
            if hit is None:
                c = covered[node]
                if B <= ID_TOKENS and c < ID_TOKENS:
                    hit = (p * ID_TOKENS + c) // B
                elif B > ID_TOKENS and (p + 1) % per_block == 0 and c < ID_TOKENS:
                    hit = (p + 1) // per_block - 1
        hit = full if hit is None else hit
        hit_blocks += min(hit, max_hit)
        cached_blocks += full - min(hit, max_hit)
        for p, node in enumerate(path):  # register every full block: cover its tokens in each id
            if B > ID_TOKENS and (p + 1) % per_block:
                continue  # an id inside a block: only the block's last id records it
            now = min(ID_TOKENS, full * B - p * ID_TOKENS)
            covered[node] = max(covered[node], now)
    return hit_blocks * B, hit_blocks, cached_blocks


def read_mooncake(path: str) -> list[tuple[int, list[int]]]:
    """(prompt tokens, hash ids) of a Mooncake JSONL trace in arrival order (stable by timestamp)."""
    import json

    with open(path, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    rows.sort(key=lambda r: r["timestamp"])
    return [(int(r["input_length"]), [int(h) for h in r["hash_ids"]]) for r in rows]


if __name__ == "__main__":  # the plain replay as a whole process: python id_replay.py TRACE BLOCK_SIZE
    import json
    import sys

    hit_tokens, hit_blocks, cached = id_replay(read_mooncake(sys.argv[1]), int(sys.argv[2]))
    print(json.dumps({"hit_tokens": hit_tokens, "hit_blocks": hit_blocks, "cached_blocks": cached}))
