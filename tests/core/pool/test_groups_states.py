"""A state group's pages against an independent model of vLLM v1's MambaManager (single_type_kv_cache_manager.py),
step by step, and the peak a request holds (groups.peak_blocks) by hand.

The model below is written from vLLM's rules, not from kvcalc's: a request's table is a list of page ids or None
(vLLM's null block). Each step c -> n first runs remove_skipped_blocks(c): get_num_skipped_tokens(c) = c − 1, so
the entries before (c − 1) // B are freed (walking back from there until a null one), and under align the page of
the previous step's end (last_state_block_idx) too when it lies before cdiv(c, B) − 1. Then allocate_new_blocks(n):
mode all tops the table up to cdiv(n, B) pages; mode align, when the table is shorter than cdiv(n, B), records the
last page as last_state_block_idx (the page the step resumes from), pads null entries to cdiv(n, B) − 1 and takes
one page. Prompts are cut as vLLM's scheduler cuts them under align (_mamba_block_aligned_split): a chunk ends on a
block boundary while the prompt's last boundary L = P − P mod B is ahead, at L when it passes it, and the tail after.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvcalc.core.pool.groups import PoolGroup, peak_blocks
from kvcalc.core.pool.hybrid import HybridPool

B = 4


class VllmMamba:
    """vLLM's MambaManager for one request, without speculative blocks: the entries that hold a page."""

    def __init__(self, mode: str, table: list | None = None) -> None:
        self.mode, self.table, self.last_state = mode, table or [], None

    def step(self, c: int, n: int) -> None:
        skipped = min(max(c - 1, 0) // B, len(self.table))  # remove_skipped_blocks(c)
        for i in range(skipped - 1, -1, -1):
            if self.table[i] is None:
                break
            self.table[i] = None
        if self.mode == "align" and self.last_state is not None and self.last_state < -(-c // B) - 1:
            self.table[self.last_state] = None
        need = -(-n // B)
        if self.mode == "all":
            self.table += [f"p{i}" for i in range(len(self.table), need)]
        elif need > len(self.table):  # allocate_new_blocks, align
            if self.table:
                self.last_state = len(self.table) - 1
            self.table += [None] * (need - 1 - len(self.table)) + [f"p{need - 1}"]

    def held(self) -> list[int]:
        return [i for i, page in enumerate(self.table) if page is not None]


def aligned_chunks(prompt: int, budget: int, start: int = 0) -> list[int]:
    """The ends of the prompt's steps from `start` under vLLM's block-aligned split, a token budget a step."""
    last, ends, c = prompt - prompt % B, [], start
    while c < prompt:
        end = c + budget
        if end < last:
            end = c + max(budget // B, 1) * B
        elif c < last < end:
            end = last
        end = min(end, prompt)
        ends.append(end)
        c = end
    return ends


@settings(max_examples=200, deadline=None)
@given(prompt=st.integers(1, 60), budget=st.integers(B, 5 * B), decode=st.integers(0, 12),
       mode=st.sampled_from(["align", "all"]), weight=st.sampled_from([1, 3]), split=st.booleans())
def test_state_pages_are_vllms_step_by_step(prompt: int, budget: int, decode: int, mode: str, weight: int,
                                            split: bool) -> None:
    # every step's held pages: kvcalc's (the entries of its table that hold a page, HybridPool.block_tables) and the
    # model's after the same step are equal, and the pool holds the full group's ceil(n / B) blocks besides them.
    # Where an align step jumps over pages, the page it resumes from is held through the step and let go at the
    # request's next step (remove_skipped_blocks frees last_state_block_idx), not at the jump. Weight 3: the state
    # group on a weighted table (core/pool/weighted.py), a page 3 units: the same pages, 3 units each.
    # split False: a caller that cuts the prompt at the budget only (not as vLLM's scheduler): under align a step
    # c -> n that passes a boundary L' = n − n mod B mid-block is two steps of vLLM's, c -> L' and L' -> n; after both
    # vLLM holds what kvcalc holds after its one
    pool = HybridPool(64 * weight, B, (PoolGroup("full"), PoolGroup("state", weight=weight)), state_mode=mode,
                      enable_prefix_caching=False)
    model = VllmMamba(mode)
    chunks = aligned_chunks(prompt, budget) if split else [*range(budget, prompt, budget), prompt]
    ends = chunks + [prompt + k for k in range(1, decode + 1)]
    c = 0
    for n in ends:
        if c == 0:
            pool.allocate("r", n)
        else:
            pool.append("r", n - c)
        if mode == "align" and c < n - n % B < n:  # (an aligned split never passes a boundary to end mid-block)
            model.step(c, n - n % B)
            model.step(n - n % B, n)
        else:
            model.step(c, n)
        ours, theirs = [i for i, b in enumerate(pool.block_tables("r")[1].tolist()) if b >= 0], model.held()
        assert ours == theirs
        assert pool.num_used == -(-n // B) + weight * len(theirs)
        assert len(theirs) <= 2 or mode == "all"
        if mode == "all":  # only the pages from the last computed token's block on
            assert ours == list(range(max(c - 1, 0) // B, (n - 1) // B + 1))
        pool.check_invariants()
        c = n


def test_peak_blocks_by_hand():
    # Falcon-H1-0.5B's groups (one full, one state) on a request of 12,100 tokens, chunks of 8,192: full
    # ceil(12,100 / 800) = 16 blocks at block 800 (align, none); align 2 state pages (vLLM's MambaSpec
    # max_memory_usage_bytes: 2 + 0 speculative), none 1; all at block 896: full ceil(12,100 / 896) = 14, state the
    # pages from the one a step resumes from to its last, at most ceil(8,192 / 896) + 1 = 11 (a step of T tokens
    # from c spans (n − 1) // B − (c − 1) // B + 1 <= ceil(T / B) + 1 pages)
    groups = (PoolGroup("full"), PoolGroup("state"))
    assert peak_blocks(groups, 12_100, 800, "align", 8_192) == 16 + 2
    assert peak_blocks(groups, 12_100, 800, "none", 8_192) == 16 + 1
    assert peak_blocks(groups, 12_100, 896, "all", 8_192) == 14 + 11
    # a request shorter than a block: one page in every mode
    assert [peak_blocks(groups, 10, 16, m, 8_192) for m in ("none", "align", "all")] == [2, 2, 2]


def test_a_jump_holds_the_page_it_resumes_from_until_the_next_step():
    # B = 4, one full and one state group, align; a prompt of 20 tokens in chunks of at most 12 (vLLM's aligned
    # split, L = 20: 0 -> 12 is 3 whole blocks; 12 + 12 = 24 passes L, so the second chunk ends at 20), then a token.
    # vLLM's MambaManager, state group:
    #   0 -> 12   cdiv(12, 4) = 3 entries: null, null, page 2                 full 3 + state 1 = 4 used
    #   12 -> 20  remove_skipped_blocks(12): (12 − 1) // 4 = 2, entries before 2 are null; cdiv(20, 4) = 5 entries:
    #             last_state_block_idx = 2 (kept), null 3, page 4            full 5 + state 2 = 7 used
    #   20 -> 21  remove_skipped_blocks(20): (20 − 1) // 4 = 4, entry 3 null (the walk stops), last_state 2 <
    #             cdiv(20, 4) − 1 = 4: page 2 freed; cdiv(21, 4) = 6: last_state 4, page 5    full 6 + state 2 = 8
    # (kvcalc before this rule let page 2 go at the jump to 20: 5 + 1 = 6 used there)
    pool = HybridPool(16, 4, (PoolGroup("full"), PoolGroup("state")), state_mode="align", enable_prefix_caching=False)
    pool.allocate("r", 12)
    assert pool.num_used == 4 and pool.held_blocks("r") == [3, 1]
    page2 = int(pool.block_tables("r")[1][2])
    copies = pool.append("r", 8)
    assert pool.num_used == 7 and pool.held_blocks("r") == [5, 2]
    state = pool.block_tables("r")[1].tolist()
    assert state[2] == page2 and state[3] == -1 and state[4] >= 0 and (page2, state[4]) in copies
    pool.check_invariants()
    pool.append("r", 1)
    assert pool.num_used == 8 and pool.held_blocks("r") == [6, 2]
    assert [i for i, b in enumerate(pool.block_tables("r")[1].tolist()) if b >= 0] == [4, 5]
    pool.check_invariants()
    pool.release("r")
    assert pool.num_used == 0
    pool.check_invariants()


@settings(max_examples=100, deadline=None)
@given(first=st.integers(1, 48), second=st.integers(2, 48), shared=st.integers(0, 12), budget=st.integers(B, 5 * B),
       weight=st.sampled_from([1, 3]))
def test_a_hit_state_is_held_as_vllm_holds_it(first: int, second: int, shared: int, budget: int, weight: int) -> None:
    # Request "a" (prompt of `first` tokens, keyed blocks 0, 1, ...) runs its aligned chunks and is released: a
    # state is saved at each step end on a boundary (vLLM caches the full block of the step's last page there).
    # Request "b" shares a's first `shared` block keys. vLLM's hit: the longest n <= min(shared · B, b's prompt − 1)
    # (rounded down to a block) where a state was saved (the full group holds every block of a's prompt, cached);
    # allocate_new_computed_blocks pads (n − 1) // B nulls before the hit page, then b runs its aligned chunks:
    # held pages and used blocks equal the model's after every step. Weight 3: the state group on a weighted table
    # (core/pool/weighted.py, layout ideal), a page 3 units of the pool: the same pages, 3 units each
    pool = HybridPool(64 * weight, B, (PoolGroup("full"), PoolGroup("state", weight=weight)), state_mode="align")
    keys_a = list(range(first // B))
    keys_b = [k if i < shared else 1000 + i for i, k in enumerate(range(second // B))]
    c = 0
    for n in aligned_chunks(first, budget):
        if c == 0:
            pool.allocate("a", n, keys_a[: n // B])
        else:
            pool.append("a", n - c, keys_a[c // B : n // B])
        c = n
    saved = {n for n in aligned_chunks(first, budget) if n % B == 0}
    pool.release("a")
    limit = min(shared, len(keys_a), (second - 1) // B) * B
    hit = max((n for n in saved if n <= limit), default=0)
    model = VllmMamba("align", [None] * (hit // B - 1) + ["hit"] if hit else [])
    c = hit
    for n in aligned_chunks(second, budget, hit):
        if c == hit:
            assert pool.allocate("b", n, keys_b[: n // B]) == hit
        else:
            pool.append("b", n - c, keys_b[c // B : n // B])
        model.step(c, n)
        ours = [i for i, b in enumerate(pool.block_tables("b")[1].tolist()) if b >= 0]
        assert ours == model.held()
        assert pool.num_used == -(-n // B) + weight * len(ours)
        pool.check_invariants()
        c = n
