"""`kvcalc sim --host-cache SIZE --disk-cache SIZE [--host-bw B/s --disk-bw B/s]`: the options as a SimTiers
(tiers.py), every error before any run. Sizes and links read as `kvcalc share`'s tier options do (one
definition: core/share/tiers.parse_tier_size, parse_bandwidth, tier_links' defaults): tokens or bytes per
GPU of the tensor-parallel group, bytes/s per GPU."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import ParameterError
from ..model.kv_groups import DEFAULT_LAYOUT
from ..model.models import ModelSpec
from ..share.tier_links import DEFAULT_DISK_BANDWIDTH, DEFAULT_HOST_BANDWIDTH
from .settings import SimSetup
from .workload import Workload

if TYPE_CHECKING:
    from .tiers import SimTiers


def sim_tiers(o: Any, spec: ModelSpec, kv_dtype: str, kv_bits: int, sim: SimSetup, workload: Workload,
              policies: list[str] | tuple[str, ...]) -> SimTiers | None:
    """The tiers of SimOptions `o` for the runs of `sim` (None when neither host_cache nor disk_cache is given)."""
    if o.host_cache is None and o.disk_cache is None:
        given = [name for name in ("host_bw", "disk_bw") if getattr(o, name) is not None]
        if given:
            raise ParameterError(f"{given[0]} is a tier's link: add host_cache or disk_cache", given[0],
                                 "host_cache", "disk_cache")
        return None
    if o.disk_bw is not None and o.disk_cache is None:
        raise ParameterError("disk_bw is the disk tier's link: add disk_cache", "disk_bw", "disk_cache")
    if o.host_bw is not None and o.host_cache is None:
        raise ParameterError("host_bw is the host tier's link: add host_cache", "host_bw", "host_cache")
    from ..share.cache_bytes import cached_block_bytes  # here: a run without tiers never loads the tiers' modules
    from ..share.tiers import parse_bandwidth, parse_tier_size
    from .tiers import SimTiers
    check_tier_setup(sim, workload, policies)
    groups, state_mode = sim.groups, sim.state_mode
    if groups is not None and any(g.kind == "state" for g in groups) and state_mode == "none":
        raise ParameterError(f"host_cache/disk_cache: {spec.name} has recurrent-state layers, and in mamba_cache_mode "
                             "none it saves no state to resume from, so it caches no prefix: add mamba_cache_mode "
                             "align", "host_cache", "disk_cache", "mamba_cache_mode")
    block = sim.block_size  # the pool's, which a hybrid's memory plan may have aligned (o.block_size as typed)
    # a tier block's bytes as the pool pages them (share's tiers and --capacity too): under vLLM's layout every
    # group's block ids with their padding slots and padded state pages, under ideal the groups' own bytes
    layout = DEFAULT_LAYOUT if o.layout is None else o.layout.strip().lower()
    cbb = cached_block_bytes(spec, kv_dtype, kv_bits, block, o.tp, "all" if state_mode == "all" else "align", layout)
    sizes = (parse_tier_size(o.host_cache, "host_cache"), parse_tier_size(o.disk_cache, "disk_cache"))
    blocks = [v.blocks(block, cbb.bytes_per_block) for v in sizes]
    return SimTiers(blocks[0], blocks[1], parse_bandwidth(o.host_bw, DEFAULT_HOST_BANDWIDTH, "host_bw"),
                    parse_bandwidth(o.disk_bw, DEFAULT_DISK_BANDWIDTH, "disk_bw"), cbb, sizes[0].text, sizes[1].text)


def check_tier_setup(sim: SimSetup, workload: Workload, policies: list[str] | tuple[str, ...]) -> None:
    """What the tiers do not run with is refused by name."""
    others = [p for p in policies if p != "paged"]
    if others:
        raise ParameterError(f"host_cache/disk_cache hold the paged pool's prefix-cache blocks: policy {others[0]} "
                             "has none; use policy paged", "host_cache", "disk_cache", "policy")
    if not (sim.prefix_caching and workload.has_prefix_ids):
        raise ParameterError("host_cache/disk_cache need a trace with prefix ids (trace mooncake FILE) and prefix "
                             "caching on (the default): nothing else says which blocks repeat",
                             "host_cache", "disk_cache", "trace")
    if sim.scheduler.timeout_s is not None:
        raise ParameterError("timeout_s with host_cache/disk_cache: a request parked for its load is not timed out "
                             "yet; drop timeout_s", "timeout_s", "host_cache", "disk_cache")
    if sim.speculation is not None:
        raise ParameterError("speculative decoding with host_cache/disk_cache is not modelled yet: drop spec_tokens",
                             "spec_tokens", "host_cache", "disk_cache")
