"""The paged forward with attention_backend="cuda-kernel" (our CUDA decode kernel) on a GPU, against the
torch-reference backend and the contiguous reference on the same GPU (marked `cuda`; skipped with a
reason when there is no GPU or no nvcc). Run with `python -m pytest -m cuda tests/cuda_ext/verify`."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from kvcalc.cuda_ext.verify.compare import first_mismatch, top_k_rule  # noqa: E402
from kvcalc.cuda_ext.verify.config import ModelConfig  # noqa: E402
from kvcalc.cuda_ext.verify.contiguous import reference_generate  # noqa: E402
from kvcalc.cuda_ext.verify.weights import init_weights  # noqa: E402

pytestmark = pytest.mark.cuda  # skipped with a reason where there is no GPU or nvcc (tests/conftest.py)
PROMPTS = [[3], [17, 4, 99, 250, 8], list(range(40, 57)), [7] * 10 + [1]]
NEW_TOKENS = 8


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("block_size", [1, 16])
def test_kernel_backend_matches_the_references(harness, dtype, block_size):
    weights = init_weights(ModelConfig(), seed=0, dtype=dtype, device="cuda")
    kernel = harness.decode_paged(weights, PROMPTS, NEW_TOKENS, block_size, attention_backend="cuda-kernel")
    torch_ref = harness.decode_paged(weights, PROMPTS, NEW_TOKENS, block_size, attention_backend="torch-reference")
    for i, prompt in enumerate(PROMPTS):
        ref = reference_generate(weights, prompt, NEW_TOKENS)
        for run in (kernel, torch_ref):
            verdict = top_k_rule(ref.output_ids, ref.logits, run.outputs[i], torch.stack(run.logits[i]), k=5)
            assert verdict.passed, verdict
        # Until the first divergence both backends see the same tokens; their logits agree closely there.
        mismatch = first_mismatch(kernel.outputs[i], torch_ref.outputs[i])
        rows = NEW_TOKENS if mismatch is None else mismatch + 1  # row j was computed from the same context
        diff = (torch.stack(kernel.logits[i][:rows]) - torch.stack(torch_ref.logits[i][:rows])).abs().max()
        assert float(diff) < 0.1, f"max |Δlogit| {float(diff):.3g} between kernel and torch reference"
