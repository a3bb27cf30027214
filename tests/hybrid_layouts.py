"""Hypothesis strategies for small hybrid pool layouts, shared by the sim tests that compare a fast path of a
GroupedPagedPolicy with the pool stepped one operation at a time (test_sim_group_counts.py,
test_sim_grow_in_order.py). (On pytest's path through `pythonpath = ["tests"]`.)"""

from __future__ import annotations

from hypothesis import strategies as st

from kvcalc.core.pool.groups import PoolGroup


@st.composite
def hybrid_groups(draw: st.DrawFn) -> tuple[int, tuple[PoolGroup, ...], str]:
    """(block size B of 2 or 4, the groups: one full-attention group and one or two of one other kind — sliding with
    a window of B + 1 .. 5B tokens, chunked with a chunk of 1 .. 3 blocks, or a recurrent state —, the
    mamba_cache_mode: all, align or none for a state, else none)."""
    B = draw(st.sampled_from([2, 4]))
    kind = draw(st.sampled_from(["sliding", "chunked", "state"]))
    window = {"sliding": draw(st.integers(B + 1, 5 * B)), "chunked": B * draw(st.integers(1, 3)), "state": None}[kind]
    groups = (PoolGroup("full"), *[PoolGroup(kind, window)] * draw(st.integers(1, 2)))
    mode = draw(st.sampled_from(["all", "align", "none"])) if kind == "state" else "none"
    return B, groups, mode
