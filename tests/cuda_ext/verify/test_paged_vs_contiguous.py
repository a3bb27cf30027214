"""The paged flat-token forward against the contiguous one-request-alone reference, same weights."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from kvcalc.cuda_ext.verify.compare import top_k_rule  # noqa: E402
from kvcalc.cuda_ext.verify.config import ModelConfig  # noqa: E402
from kvcalc.cuda_ext.verify.contiguous import (  # noqa: E402
    allocate_contiguous_kv,
    contiguous_forward,
    reference_generate,
)
from kvcalc.cuda_ext.verify.paged import copy_blocks, paged_forward, swap_in, swap_out  # noqa: E402
from kvcalc.cuda_ext.verify.paged_batch import SequenceChunk, build_paged_batch  # noqa: E402
from kvcalc.cuda_ext.verify.weights import init_weights  # noqa: E402

FP32_LOGIT_TOL = 1e-5
RAGGED_PROMPTS = [[3], [17, 4, 99, 250, 8], list(range(40, 57)), [7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 1]]
NEW_TOKENS = 6


@pytest.fixture(scope="module")
def weights():
    return init_weights(ModelConfig(), seed=0)


def max_diff(rows, reference) -> float:
    return float((torch.stack(rows) - reference).abs().max())


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_ragged_batch_equals_each_request_alone(weights, harness, block_size):
    run = harness.decode_paged(weights, RAGGED_PROMPTS, NEW_TOKENS, block_size, layout_seed=block_size)
    flat = [b for t in run.tables for b in t]
    assert flat != sorted(flat)  # the physical order is not the logical one
    for i, prompt in enumerate(RAGGED_PROMPTS):
        ref = reference_generate(weights, prompt, NEW_TOKENS)
        assert tuple(run.outputs[i]) == ref.output_ids
        assert max_diff(run.logits[i], ref.logits) < FP32_LOGIT_TOL


def test_chunked_prefill_equals_whole_prefill(weights, harness):
    prompt = list(range(100, 120))  # 20 tokens: chunks of 3 end mid-block and mid-chunk
    whole = reference_generate(weights, prompt, NEW_TOKENS)
    chunked_ref = reference_generate(weights, prompt, NEW_TOKENS, prefill_chunk_tokens=3)
    paged = harness.decode_paged(weights, [prompt, [5, 6]], NEW_TOKENS, 4, prefill_chunk_tokens=3)
    assert chunked_ref.output_ids == whole.output_ids == tuple(paged.outputs[0])
    assert float((chunked_ref.logits - whole.logits).abs().max()) < FP32_LOGIT_TOL
    assert max_diff(paged.logits[0], whole.logits) < FP32_LOGIT_TOL
    assert tuple(paged.outputs[1]) == reference_generate(weights, [5, 6], NEW_TOKENS).output_ids


def test_all_logits_of_a_prefill_equal_the_contiguous_prefill(weights, harness):
    prompts = [list(range(1, 12)), list(range(30, 37))]
    kv = harness.poisoned_paged_kv(weights.config, 16, 4)
    tables = harness.shuffled_tables([11, 7], 4, 16, seed=5)
    batch = build_paged_batch([SequenceChunk(tuple(p), 0, t) for p, t in zip(prompts, tables, strict=True)], 4)
    logits = paged_forward(weights, kv, batch, return_all_logits=True)  # [18, vocab]
    assert logits.shape == (18, weights.config.vocab_size)
    for p, rows in zip(prompts, (logits[:11], logits[11:]), strict=True):
        expected = contiguous_forward(weights, allocate_contiguous_kv(weights.config, 16), p)
        assert float((rows - expected).abs().max()) < FP32_LOGIT_TOL


def test_copy_on_write_then_append_equals_recomputing(weights, harness):
    # Parent prompt of 6 tokens in blocks of 4: block 0 full, block 1 holds 2 tokens (partially filled).
    # A fork shares block 0 and gets a copy of block 1; then parent and child append different tokens.
    block_size, prompt = 4, [11, 22, 33, 44, 55, 66]
    kv = harness.poisoned_paged_kv(weights.config, 8, block_size)
    parent_table, child_table = (5, 2), (5, 7)
    paged_forward(weights, kv, build_paged_batch([SequenceChunk(tuple(prompt), 0, parent_table)], block_size))
    copy_blocks(kv, [(2, 7)])
    step = build_paged_batch(
        [SequenceChunk((1,), 6, parent_table), SequenceChunk((200,), 6, child_table)], block_size
    )
    logits = paged_forward(weights, kv, step)
    for row, tail in zip(logits, ([1], [200]), strict=True):
        expected = contiguous_forward(weights, allocate_contiguous_kv(weights.config, 8), prompt + tail)[-1]
        assert float((row - expected).abs().max()) < FP32_LOGIT_TOL
    # The parent's append wrote into block 2 only: the child's copy holds the 2-token prefix + 200.
    assert torch.equal(kv.k[0][2, :2], kv.k[0][7, :2]) and not torch.equal(kv.k[0][2, 2], kv.k[0][7, 2])


def test_a_fork_without_the_copy_reads_garbage(weights, harness):
    # Negative control for the test above: skip copy_blocks and the child's block 7 is unwritten.
    block_size, prompt = 4, [11, 22, 33, 44, 55, 66]
    kv = harness.poisoned_paged_kv(weights.config, 8, block_size)
    paged_forward(weights, kv, build_paged_batch([SequenceChunk(tuple(prompt), 0, (5, 2))], block_size))
    row = paged_forward(weights, kv, build_paged_batch([SequenceChunk((200,), 6, (5, 7))], block_size))[0]
    expected = contiguous_forward(weights, allocate_contiguous_kv(weights.config, 8), [*prompt, 200])[-1]
    assert float((row - expected).abs().max()) > 1e-2


def test_swap_out_and_in_to_other_blocks_continues_the_same_decoding(weights, harness):
    block_size, prompt = 4, list(range(60, 69))  # 9 tokens: 3 blocks, the last holding 1
    ref = reference_generate(weights, prompt, 3)
    kv = harness.poisoned_paged_kv(weights.config, 10, block_size)
    table = (4, 0, 9)
    logits = paged_forward(weights, kv, build_paged_batch([SequenceChunk(tuple(prompt), 0, table)], block_size))
    first = int(logits[0].argmax())
    swapped = swap_out(kv, table)
    for t in (*kv.k, *kv.v):
        t[list(table)] = -7.0  # the pool hands the blocks to someone else, who overwrites them
    new_table = (1, 6, 3, 8)  # one more block for the next tokens
    swap_in(kv, swapped, new_table[:3])
    second_logits = paged_forward(weights, kv, build_paged_batch([SequenceChunk((first,), 9, new_table)], block_size))
    assert (first, int(second_logits[0].argmax())) == ref.output_ids[:2]
    assert float((second_logits[0] - ref.logits[1]).abs().max()) < FP32_LOGIT_TOL


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_low_precision_passes_the_top_k_rule(harness, dtype):
    weights = init_weights(ModelConfig(), seed=0, dtype=dtype)
    run = harness.decode_paged(weights, RAGGED_PROMPTS, NEW_TOKENS, 4, layout_seed=9)
    for i, prompt in enumerate(RAGGED_PROMPTS):
        ref = reference_generate(weights, prompt, NEW_TOKENS)
        verdict = top_k_rule(ref.output_ids, ref.logits, run.outputs[i], torch.stack(run.logits[i]), k=5)
        assert verdict.passed, verdict
        assert torch.isfinite(ref.logits).all()
