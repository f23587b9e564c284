"""apply_token_bitmask_: the Triton kernel against the plain-torch reference."""
from __future__ import annotations

import pytest
import torch

from tamis.kernels.bitmask import (apply_token_bitmask_, apply_token_bitmask_cpu,
                                   apply_token_bitmask_ref, apply_token_bitmask_triton,
                                   unpack_bitmask)


def _random_bitmask(rows: int, vocab: int, device="cpu") -> torch.Tensor:
    words = (vocab + 31) // 32
    return torch.randint(-2**31, 2**31 - 1, (rows, words), dtype=torch.int32, device=device)


def test_reference_matches_bit_by_bit_definition():
    bitmask = _random_bitmask(3, 70)
    logits = torch.randn(3, 70)
    expected = logits.clone()
    for r in range(3):
        for t in range(70):
            word = int(bitmask[r, t // 32]) & 0xFFFFFFFF
            if not (word >> (t % 32)) & 1:
                expected[r, t] = float("-inf")
    assert torch.equal(apply_token_bitmask_ref(logits.clone(), bitmask), expected)


def test_unpack_masks_the_tail_past_the_mask():
    bitmask = torch.full((1, 1), -1, dtype=torch.int32)   # all 32 tokens allowed
    allowed = unpack_bitmask(bitmask, 40)
    assert allowed[0, :32].all() and not allowed[0, 32:].any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("rows,vocab,logit_vocab", [(1, 32, 32), (4, 100, 100), (3, 77, 130),
                                                    (5, 1000, 1000)])
def test_triton_matches_reference(dtype, rows, vocab, logit_vocab):
    bitmask = _random_bitmask(rows, vocab)
    logits = torch.randn(rows, logit_vocab, dtype=dtype)
    expected = apply_token_bitmask_ref(logits.clone(), bitmask)
    got = apply_token_bitmask_triton(logits.clone(), bitmask)
    assert torch.equal(got, expected)
    assert torch.isinf(got).any() and torch.isfinite(got).any()


def test_indices_touch_only_listed_rows():
    bitmask = _random_bitmask(6, 90)
    logits = torch.randn(6, 90)
    indices = [0, 3, 5]
    expected = apply_token_bitmask_ref(logits.clone(), bitmask, indices)
    got = apply_token_bitmask_triton(logits.clone(), bitmask, torch.tensor(indices))
    assert torch.equal(got, expected)
    untouched = [1, 2, 4]
    assert torch.equal(got[untouched], logits[untouched])
    assert torch.isinf(got[indices]).any()


def test_all_allowed_leaves_logits_unchanged():
    logits = torch.randn(2, 64)
    bitmask = torch.full((2, 2), -1, dtype=torch.int32)
    assert torch.equal(apply_token_bitmask_triton(logits.clone(), bitmask), logits)


@pytest.mark.parametrize("rows,vocab,logit_vocab", [(1, 32, 32), (4, 100, 100), (3, 77, 130),
                                                    (32, 49152, 49152)])
def test_cpu_path_matches_reference(rows, vocab, logit_vocab):
    bitmask = _random_bitmask(rows, vocab)
    logits = torch.randn(rows, logit_vocab)
    logits[0, :3] = torch.tensor([float("inf"), float("-inf"), float("nan")])
    expected = apply_token_bitmask_ref(logits.clone(), bitmask)
    got = apply_token_bitmask_cpu(logits.clone(), bitmask)
    assert torch.equal(got.isnan(), expected.isnan())
    assert torch.equal(got.nan_to_num(), expected.nan_to_num())
    assert torch.isinf(got).any() and torch.isfinite(got).any()


def test_dispatcher_on_cpu_matches_reference():
    bitmask = _random_bitmask(2, 50)
    logits = torch.randn(2, 50)
    assert torch.equal(apply_token_bitmask_(logits.clone(), bitmask),
                       apply_token_bitmask_ref(logits.clone(), bitmask))


@pytest.mark.parametrize("bad, message", [
    (lambda l, m: (l[0], m), "2-D float"),
    (lambda l, m: (l, m.to(torch.int64)), "int32"),
    (lambda l, m: (l, m[:1]), "rows"),
])
def test_bad_input_names_the_problem(bad, message):
    logits, bitmask = torch.randn(2, 40), _random_bitmask(2, 40)
    with pytest.raises(ValueError, match=message):
        apply_token_bitmask_(*bad(logits, bitmask))


def test_out_of_range_indices_rejected():
    with pytest.raises(ValueError, match="indices"):
        apply_token_bitmask_(torch.randn(2, 40), _random_bitmask(2, 40), [2])


@pytest.mark.gpu
def test_triton_matches_reference_on_gpu():
    rows, vocab, logit_vocab = 256, 128_256, 128_256 + 64
    bitmask = _random_bitmask(rows, vocab, "cuda")
    logits = torch.randn(rows, logit_vocab, dtype=torch.bfloat16, device="cuda")
    expected = apply_token_bitmask_ref(logits.clone(), bitmask)
    assert torch.equal(apply_token_bitmask_(logits.clone(), bitmask), expected)
    indices = torch.arange(0, rows, 3, device="cuda")
    expected = apply_token_bitmask_ref(logits.clone(), bitmask, indices)
    assert torch.equal(apply_token_bitmask_(logits.clone(), bitmask, indices), expected)
