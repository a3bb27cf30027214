"""PagedBatch: the flattened layout build_paged_batch produces, and the contradictions validation rejects."""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")

from kvcalc.cuda_ext.verify.attention import check_attention_backend, default_attention_backend  # noqa: E402
from kvcalc.cuda_ext.verify.config import ModelConfig  # noqa: E402
from kvcalc.cuda_ext.verify.paged import allocate_paged_kv, copy_blocks, paged_forward, swap_in, swap_out  # noqa: E402
from kvcalc.cuda_ext.verify.paged_batch import (  # noqa: E402
    InvalidPagedBatch,
    SequenceChunk,
    build_paged_batch,
    validate_paged_batch,
)
from kvcalc.cuda_ext.verify.weights import init_weights  # noqa: E402

BLOCK_SIZE = 4


def two_sequences():
    # Sequence 0: 5 tokens cached, decodes 1 at position 5 -> block 9 (table [3, 9]), offset 1 -> slot 37.
    # Sequence 1: a prefill chunk of 3 at positions 2..4 through table [0, 6]: slots 2, 3, then 6*4+0 = 24.
    return [SequenceChunk((42,), 5, (3, 9)), SequenceChunk((7, 8, 9), 2, (0, 6))]


def test_build_flattens_tokens_positions_slots_and_tables():
    batch = build_paged_batch(two_sequences(), BLOCK_SIZE, max_blocks=3)
    assert batch.token_ids.tolist() == [42, 7, 8, 9]
    assert batch.positions.tolist() == [5, 2, 3, 4]
    assert batch.slot_mapping.tolist() == [37, 2, 3, 24]
    assert batch.query_start_loc.tolist() == [0, 1, 4]
    assert batch.seq_lens.tolist() == [6, 5]
    assert batch.block_tables.tolist() == [[3, 9, -1], [0, 6, -1]]
    assert batch.block_tables.dtype == torch.int32 and batch.seq_lens.dtype == torch.int32
    validate_paged_batch(batch, num_blocks=10, block_size=BLOCK_SIZE)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"slot_mapping": torch.tensor([37, 2, 3, 25])}, "disagrees with its block table"),
        ({"slot_mapping": torch.tensor([37, 2, 2, 24])}, "two tokens into one slot"),
        ({"positions": torch.tensor([5, 1, 2, 3])}, "positions"),
        ({"seq_lens": torch.tensor([6, 2], dtype=torch.int32)}, "seq_len 2 must lie in 3..8"),
        ({"query_start_loc": torch.tensor([0, 0, 4], dtype=torch.int32)}, "must rise strictly"),
        ({"block_tables": torch.tensor([[3, 10], [0, 6]], dtype=torch.int32)}, "outside 0..9"),
        ({"token_ids": torch.tensor([42, 7, 8, 9], dtype=torch.int32)}, "token_ids is torch.int32"),
    ],
)
def test_validation_names_the_contradiction(change, message):
    batch = dataclasses.replace(build_paged_batch(two_sequences(), BLOCK_SIZE), **change)
    with pytest.raises(InvalidPagedBatch, match=message):
        validate_paged_batch(batch, num_blocks=10, block_size=BLOCK_SIZE)


def test_paged_forward_validates_before_writing():
    cfg = ModelConfig()
    weights, kv = init_weights(cfg), allocate_paged_kv(cfg, 10, BLOCK_SIZE)
    batch = build_paged_batch(two_sequences(), BLOCK_SIZE)
    batch = dataclasses.replace(batch, slot_mapping=torch.tensor([37, 2, 3, 25]))
    with pytest.raises(InvalidPagedBatch):
        paged_forward(weights, kv, batch)
    assert all(not t.any() for t in (*kv.k, *kv.v))


def test_copy_and_swap_move_whole_blocks_in_every_layer():
    cfg = ModelConfig(num_layers=3)
    kv = allocate_paged_kv(cfg, 6, BLOCK_SIZE)
    for layer, t in enumerate((*kv.k, *kv.v)):
        for block in range(6):
            t[block] = 100 * layer + block  # every element names its (layer, block)
    copy_blocks(kv, [(1, 4), (4, 5)])  # sources are read first: 5 gets the old 4, not the new one
    assert [int(kv.k[2][b, 0, 0, 0]) for b in range(6)] == [200, 201, 202, 203, 201, 204]
    swapped = swap_out(kv, [0, 3])
    assert swapped.k[0].device.type == "cpu" and swapped.k[0].shape == (2, BLOCK_SIZE, 2, 64)
    swap_in(kv, swapped, [2, 1])
    assert [int(kv.v[1][b, 0, 0, 0]) for b in range(6)] == [400, 403, 400, 403, 401, 404]
    with pytest.raises(ValueError, match="repeat a block"):
        copy_blocks(kv, [(0, 1), (2, 1)])
    with pytest.raises(ValueError, match=r"outside 0\.\.5"):
        swap_out(kv, [6])
    with pytest.raises(ValueError, match="2 distinct block ids"):
        swap_in(kv, swapped, [1])


def test_the_cuda_kernel_backend_says_why_it_cannot_run_here():
    cfg = ModelConfig(head_dim=32)
    with pytest.raises(ValueError, match=r"device cpu is not CUDA; dtype torch.float32 is not bf16/fp16; head_dim 32"):
        check_attention_backend("cuda-kernel", cfg, torch.float32, torch.device("cpu"), 16)
    with pytest.raises(ValueError, match="unknown"):
        check_attention_backend("flash", cfg, torch.float32, torch.device("cpu"), 16)
    assert default_attention_backend(ModelConfig(), torch.bfloat16, torch.device("cpu"), 16) == "torch-reference"
    assert default_attention_backend(ModelConfig(), torch.bfloat16, torch.device("cuda"), 16) == "cuda-kernel"
    assert default_attention_backend(ModelConfig(), torch.bfloat16, torch.device("cuda"), 12) == "torch-reference"
