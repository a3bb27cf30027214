"""The pass rule on hand-made decodings, and the shadow content check on a hand-made cache."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from kvcalc.cuda_ext.verify.shadow import ShadowKV, prefix_ids  # noqa: E402
from kvcalc.cuda_ext.verify.verdict import Decoding, compare, fp32_logit_tolerance  # noqa: E402

# the tolerance of a 2-layer model whose largest logit is 3 (rows() below): 16 x 2 x 2^-23 x 3 = 1.14e-5
TOLERANCE = 16 * 2 * 2.0**-23 * 3


def rows(*best: int, vocab: int = 8) -> torch.Tensor:
    """[len(best), vocab]: token best[i] has logit 3, token (best[i] + 1) % vocab logit 2, the rest 0."""
    out = torch.zeros(len(best), vocab)
    for i, b in enumerate(best):
        out[i, b], out[i, (b + 1) % vocab] = 3.0, 2.0
    return out


def test_identical_decodings_pass_and_report_the_logit_difference():
    ref = Decoding((1, 2, 3), rows(1, 2, 3))
    test = Decoding((1, 2, 3), rows(1, 2, 3) + TOLERANCE / 2)
    verdict = compare([ref], [test], exact=True)
    assert (verdict.tokens_compared, verdict.mismatched_tokens, verdict.first_mismatch) == (3, 0, None)
    # float32 rounds 3 + 5.7e-6 to a multiple of 2^-22 (2.4e-7): the difference is 5.7e-6 to within 10 %
    assert verdict.max_abs_logit_diff == pytest.approx(TOLERANCE / 2, rel=0.1) and verdict.passed
    assert verdict.logit_tolerance == TOLERANCE == fp32_logit_tolerance(2, 3.0)


def test_the_fp32_tolerance_grows_with_depth_and_the_logits_scale():
    # SmolLM2-135M: 30 layers, logits near 30 -> 16 x 30 x 2^-23 x 30 = 1.72e-3 (its paths differ by ~1e-4)
    assert fp32_logit_tolerance(30, 30.0) == pytest.approx(1.7166e-3, rel=1e-4)
    assert fp32_logit_tolerance(2, 0.5) == fp32_logit_tolerance(2, 1.0)  # logits below 1 count as 1


def test_fp32_fails_on_a_logit_past_the_tolerance_even_with_equal_tokens():
    logits = rows(1, 2)
    logits[1, 5] += 2 * TOLERANCE
    assert not compare([Decoding((1, 2), rows(1, 2))], [Decoding((1, 2), logits)], exact=True).passed


def test_a_mismatch_counts_and_names_its_first_position():
    ref = [Decoding((4,), rows(4)), Decoding((1, 2, 3), rows(1, 2, 3))]
    test = [Decoding((4,), rows(4)), Decoding((1, 3, 3, 0), rows(1, 3, 3, 0))]
    verdict = compare(ref, test, exact=True)
    # request 1: position 1 differs (2 vs 3), and the test has one token more: 2 mismatches of 4 compared
    assert (verdict.tokens_compared, verdict.mismatched_tokens) == (4, 2)
    assert verdict.first_mismatch == {"request": 1, "position": 1, "reference_token": 2, "test_token": 3,
                                      "within_top_k": None}
    assert not verdict.passed


def test_the_top_k_rule_accepts_a_near_tie_and_refuses_a_far_token():
    ref = Decoding((1, 2), rows(1, 2), top_k=2)
    near = rows(1, 3)  # at row 1 the test chose 3, the reference's second best
    near[1, 2] = 2.5  # now it is: the test's top 2 at row 1 is {3, 2}
    assert compare([ref], [Decoding((1, 3), near)], exact=False).passed
    far = rows(1, 6)  # token 6 is not among the reference's top 2 at row 1 ({2, 3})
    verdict = compare([ref], [Decoding((1, 6), far)], exact=False)
    assert not verdict.passed and verdict.first_mismatch["within_top_k"] is False


def test_a_truncated_decoding_fails_every_rule():
    ref = Decoding((1, 2, 3), rows(1, 2, 3))
    for exact in (True, False):
        verdict = compare([ref], [Decoding((1,), rows(1))], exact=exact)
        assert not verdict.passed and verdict.mismatched_tokens == 2
        assert verdict.first_mismatch["test_token"] is None


def test_prefix_ids_identify_prefixes_not_tokens():
    a, b = prefix_ids([5, 6, 7]), prefix_ids([5, 9, 7])
    assert a[0] == b[0] and a[1] != b[1] and a[2] != b[2]  # same token 7 at position 2, other prefix
    assert np.array_equal(prefix_ids([5, 6, 7, 8])[:3], a)


def test_the_shadow_finds_a_slot_written_by_another_prefix():
    shadow = ShadowKV(num_blocks=4, block_size=2)
    mine, other = prefix_ids([1, 2, 3]), prefix_ids([1, 2, 4])
    table = np.array([3, 0])  # positions 0, 1 in block 3; position 2 in block 0
    slots = np.array([6, 7, 0])
    shadow.write(slots, mine, np.arange(3))
    assert shadow.first_wrong(table, mine) is None
    shadow.write(slots[2:], other[2:], np.array([2]))  # a sibling's token written into the shared block
    assert shadow.first_wrong(table, mine) == 2
    shadow.copy_blocks([(3, 1)])  # copy-on-write moves the identities along
    assert shadow.first_wrong(np.array([1]), mine[:2]) is None
    saved = shadow.save([1])
    shadow.write(np.array([2, 3]), other[:2] + 1, np.arange(2))  # block 1 handed out and overwritten
    assert shadow.first_wrong(np.array([1]), mine[:2]) == 0
    shadow.restore(saved, [1])  # swapped back in
    assert shadow.first_wrong(np.array([1]), mine[:2]) is None
