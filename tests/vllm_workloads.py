"""The workloads and pools of the comparisons of kvcalc's sim with the vLLM model (tests/core/sim/test_sim_vllm_*.py):
hypothesis strategies and the settings they run under."""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from vllm_model import Req

B = 128  # tiles Mooncake's 512-token ids: each id is 4 blocks


@st.composite
def requests(draw, max_total: int = 2048) -> list[Req]:
    """2-9 requests; prompts share a leading run of ids from one chain (1, 2, 3, ...) then ids of their own."""
    n = draw(st.integers(2, 9))
    reqs, t = [], 0.0
    for i in range(n):
        t += draw(st.sampled_from([0.0, 0.0, 0.5, 1.0, 3.0]))
        prompt = draw(st.integers(1, max_total - 64))
        output = draw(st.integers(1, min(draw(st.sampled_from([16, 64, 400])), max_total - prompt)))
        num_ids = -(-prompt // 512)
        shared = draw(st.integers(0, num_ids))
        ids = tuple(range(1, shared + 1)) + tuple(1000 * (i + 1) + k for k in range(num_ids - shared))
        reqs.append(Req(i, t, prompt, output, ids))
    return reqs


# derandomized: the same examples every run (a long search draws new ones with settings of its own)
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True,
                    database=None)
MAX_LEN = 2048
BUDGETS = [64, 128, 200, 256, 512, 2048]


def pool_blocks(draw, per_request: int) -> int:
    # at least a max-length request's blocks per group (vLLM's start-up check; none is refused), at most twice that:
    # preemption is common
    return draw(st.integers(per_request + 1, 2 * per_request + 1))
