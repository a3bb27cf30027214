"""KV bytes of pool blocks, a memory budget in blocks, and refusals that name the parameter and the figures."""

from __future__ import annotations

import numpy as np
import pytest

from kvcalc.core import host_memory
from kvcalc.core.errors import ParameterError
from kvcalc.core.model.models import get_preset
from kvcalc.core.pool.block_pool import BlockPool
from kvcalc.core.pool.store import BlockStore
from kvcalc.core.share.forks import ScenarioSpec, run_scenario
from kvcalc.core.share.memory import block_bytes, blocks_in_memory, bytes_upper_bound, pool_bytes

MIB = 2**20


def test_block_bytes_of_a_preset() -> None:
    # Llama-3-8B: 2 (K, V) · 32 layers · 8 KV heads · 128 dims · 2 bytes = 131,072 B a token; 16 tokens = 2 MiB
    llama = get_preset("llama-3-8b")
    assert block_bytes(llama, 16, 16) == 16 * 131_072 == 2 * MIB
    # int4: 4 bits a scalar, a quarter of the fp16 block; one token is 32,768 B
    assert block_bytes(llama, 4, 1) == 32_768
    with pytest.raises(ParameterError, match=r"^block_size 0 must be a positive"):
        block_bytes(llama, 16, 0)


def test_blocks_in_memory_floors_and_refuses_what_holds_too_few() -> None:
    assert blocks_in_memory(140 * MIB, 2 * MIB) == 70
    assert blocks_in_memory(140 * MIB + 1, 2 * MIB) == 70  # a part block holds nothing
    with pytest.raises(ParameterError, match=r"^memory_bytes 1.00 KiB holds no block of 2.00 MiB") as raised:
        blocks_in_memory(1024, 2 * MIB)
    assert raised.value.params == ("memory_bytes",)
    # 10 blocks fit, the largest request needs 70: 70 · 2 MiB = 140 MiB
    with pytest.raises(ParameterError, match=r"holds 10 blocks of 2.00 MiB, fewer than the 70 .*give at least 140MiB$"):
        blocks_in_memory(20 * MIB, 2 * MIB, 70, "the largest request needs")


def test_bytes_are_an_upper_bound_only_past_a_window() -> None:
    # Mistral-7B-v0.1: every layer keeps the last 4,096 tokens
    mistral, llama = get_preset("mistral-7b-v0.1"), get_preset("llama-3-8b")
    assert not bytes_upper_bound(mistral, 16, 4096) and bytes_upper_bound(mistral, 16, 4097)
    assert not bytes_upper_bound(llama, 16, 10**6)
    kv = pool_bytes(mistral, "bf16", 16, 16, 8100)
    assert (kv.bytes_per_block, kv.upper_bound, kv.of_blocks(3)) == (2 * MIB, True, 6 * MIB)


def test_store_memory_bytes_is_what_a_store_allocates() -> None:
    for num_blocks in (1, 7, 100, 5_000, 300_000):
        pool = BlockPool(num_blocks, 16)
        arrays = {id(a): a.nbytes for part in (pool.store, pool.store.queue, pool.store.index, pool.store.index.dups)
                  for a in vars(part).values() if isinstance(a, np.ndarray)}
        # the estimate leaves out 2 spare LRU entries and the 2-entry floor of the hash arrays: <= 24 bytes
        assert 0 <= sum(arrays.values()) - BlockStore.memory_bytes(num_blocks) <= 24


def test_a_scenario_past_the_machines_memory_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host_memory, "available_bytes", lambda: MIB)
    with pytest.raises(ParameterError, match=r"^branches 1000 × \(prefix_tokens 1000 \+ gen_tokens 200\)") as raised:
        ScenarioSpec(1000, 1000, 200, 16)
    assert "1.00 MiB available" in str(raised.value) and raised.value.params[0] == "branches"
    ScenarioSpec(1000, 4, 200, 16)  # a small one fits


def test_scenario_errors_name_parameters_not_flags() -> None:
    for args, start in [((10, 0, 5, 16), "branches 0"), ((0, 2, 5, 16), "prefix_tokens 0"),
                        ((10, 2, -1, 16), "gen_tokens -1"), ((10, 2, 5, 0), "block_size 0")]:
        with pytest.raises(ParameterError, match=f"^{start}") as raised:
            ScenarioSpec(*args)
        assert "--" not in str(raised.value)
    with pytest.raises(ParameterError, match=r"^seed -1 is negative"):
        ScenarioSpec(10, 2, 5, 16, mode="beam", seed=-1)
    with pytest.raises(ParameterError, match=r"^mode 'greedy' is unknown"):
        ScenarioSpec(10, 2, 5, 16, mode="greedy")


def test_scenario_progress_counts_decode_steps() -> None:
    steps: list[int] = []
    result = run_scenario(ScenarioSpec(37, 5, 23, 8, mode="beam", seed=4), progress=steps.append)
    assert steps == [1] * 23 and result == run_scenario(ScenarioSpec(37, 5, 23, 8, mode="beam", seed=4))
