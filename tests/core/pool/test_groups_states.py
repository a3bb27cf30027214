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

    def __init__(self, mode: str) -> None:
        self.mode, self.table, self.last_state = mode, [], None

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


def aligned_chunks(prompt: int, budget: int) -> list[int]:
    """The ends of the prompt's steps under vLLM's block-aligned split, a token budget a step."""
    last, ends, c = prompt - prompt % B, [], 0
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


@settings(max_examples=150, deadline=None)
@given(prompt=st.integers(1, 60), budget=st.integers(B, 5 * B), decode=st.integers(0, 12),
       mode=st.sampled_from(["align", "all"]))
def test_state_pages_are_vllms_step_by_step(prompt: int, budget: int, decode: int, mode: str) -> None:
    # every step's held pages: kvcalc's (the non-null entries of its table) and the model's after the same step.
    # They are equal, except that where an align step jumps over pages kvcalc lets the page it resumes from go at
    # the jump (pending inside a step window) and vLLM at the next step: then the model holds that page besides
    pool = HybridPool(64, B, (PoolGroup("full"), PoolGroup("state")), state_mode=mode, enable_prefix_caching=False)
    model = VllmMamba(mode)
    ends = aligned_chunks(prompt, budget) + [prompt + k for k in range(1, decode + 1)]
    c = 0
    for n in ends:
        if c == 0:
            pool.allocate("r", n)
        else:
            pool.append("r", n - c)
        model.step(c, n)
        ours, theirs = [i for i, b in enumerate(pool.block_tables("r")[1].tolist()) if b >= 0], model.held()
        resume, last = (c - 1) // B, (n - 1) // B
        assert ours == theirs or (mode == "align" and c and last > resume + 1 and ours == [last]
                                  and theirs == [resume, last])
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
