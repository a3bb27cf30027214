"""Checks of `kvcalc sim`'s options against each other once the policies and the workload are known (setup.build
calls them): options that would change nothing are refused, and what vLLM would refuse at start-up is named.

Each raises a ParameterError naming the options (SimOptions fields) and the fix, or returns the start-up refusals
that the simulation still runs (warned on stderr and noted, as `kvcalc size --gpu` does)."""

from __future__ import annotations

import math

from ..errors import ParameterError
from ..model.models import ModelSpec
from ..notes import Note, concat
from .options import SimOptions
from .workload import Workload


def check_preempt_policies(o: SimOptions, policies: list[str]) -> None:
    """Swap moves a preempted request's blocks; a reservation holds the request's whole length from admission,
    so without the paged policy nothing is ever preempted (reserve.py: growth never needs memory)."""
    if o.preempt.strip().lower() == "swap" and "paged" not in policies:
        flag = "compare" if o.compare is not None else "policy"
        raise ParameterError(f"preempt swap moves a preempted request's blocks, and {flag} {','.join(policies)} "
                             "reserves each request's whole length at admission, so nothing is ever preempted: add "
                             "paged or drop preempt", "preempt", flag)


def check_rate_inf_arrival(o: SimOptions, rate: float) -> None:
    """At rate inf every request arrives at time 0: an arrival process spaces nothing (a max-rate search still
    divides its seeded unit-rate gaps by each rate it tries, so there it counts)."""
    if rate == math.inf and o.arrival is not None and not o.find_max_rate:
        raise ParameterError(f"arrival {o.arrival} with rate inf: every request arrives at time 0, so nothing is "
                             "spaced by it (only a max-rate search divides its unit-rate gaps): drop arrival, or give "
                             "a finite rate", "arrival", "rate")


def check_workload_options(o: SimOptions, workload: Workload, policies: list[str]) -> None:
    """Before any run: swap without the paged policy, prefix caching turned off where no block could hit, a
    max-rate search on one arrival (search.max_rate refuses it too, but only after the first run)."""
    check_preempt_policies(o, policies)
    if not o.prefix_caching and not workload.has_prefix_ids and workload.prompt_token_ids is None:
        raise ParameterError("no_prefix_caching: the workload has no prefix ids (constructed requests and Azure traces "
                             "say nothing of their content), so no block can hit and turning the cache off changes "
                             "nothing: drop no_prefix_caching, or give trace mooncake FILE", "no_prefix_caching",
                             "trace")
    if o.find_max_rate and len(workload) < 2:
        raise ParameterError(f"find_max_rate needs at least 2 arrivals (a rate is defined by inter-arrival gaps) and "
                             f"the workload has {len(workload)}: give requests 2 or more, or a trace of 2 or more",
                             "find_max_rate", "requests")


def start_refusals(o: SimOptions, spec: ModelSpec, notes: list[str]) -> list[str]:
    """What vLLM refuses at start-up that the simulation can still run (kvcalc size --gpu warns of the same), each
    also added to `notes`: a max_model_len above the model's max_position_embeddings (vLLM's
    _get_and_verify_max_len, unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1)."""
    limit = spec.max_position_embeddings
    if o.max_model_len is None or limit is None or o.max_model_len <= limit:
        return []
    refusals: list[str] = [Note(f"{{max_model_len}} {o.max_model_len:,} is above the model's max_position_embeddings "
                                f"{limit:,} (allowed only with VLLM_ALLOW_LONG_MAX_MODEL_LEN=1, or where the config's "
                                "rope_scaling extends the length)", "max_model_len")]
    notes += [concat("vLLM would not start: ", r, "; simulated as given") for r in refusals]
    return refusals
