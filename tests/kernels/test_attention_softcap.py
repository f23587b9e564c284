"""Attention logit soft-capping (Gemma 2): scores ``C * tanh(s / C)`` before the softmax.

The references are checked against transformers' eager formula written out densely; the
Triton kernels (interpreted on CPU) and both attention backends against the references.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from paged_cases import dense_kv, make_case  # noqa: E402
from test_triton_backend import _step  # noqa: E402

from tamis.engine.attention.torch_backend import TorchAttentionBackend  # noqa: E402
from tamis.engine.attention.triton_backend import TritonAttentionBackend  # noqa: E402
from tamis.kernels.attention_decode import (paged_attention_decode_ref,  # noqa: E402
                                            paged_attention_decode_triton)
from tamis.kernels.attention_prefill import (paged_attention_prefill_ref,  # noqa: E402
                                             paged_attention_prefill_triton)

SCALE, CAP = 0.9, 2.0   # scores of random q/k reach ~10: a cap of 2 changes every row


def _eager_softcapped(q, k, v, context_len, window=None):
    """transformers' eager_attention_forward with softcap, for one sequence."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = torch.einsum("qhd,khd->hqk", q, k) * SCALE
    scores = torch.tanh(scores / CAP) * CAP
    q_pos = torch.arange(context_len, context_len + q.shape[0])[:, None]
    k_pos = torch.arange(k.shape[0])[None, :]
    hidden = (k_pos > q_pos) | ((q_pos - k_pos >= window) if window else False)
    scores = scores.masked_fill(hidden, float("-inf"))
    return torch.einsum("hqk,khd->qhd", torch.softmax(scores, dim=-1), v)


def _prefill(case, impl, window=None, soft_cap=CAP):
    args = (case.q, case.kv_cache, case.query_start_loc, case.seq_lens, case.block_tables, SCALE)
    if impl is paged_attention_prefill_triton:
        return impl(*args, window, case.max_query_len, soft_cap=soft_cap)
    return impl(*args, window, soft_cap)


@pytest.mark.parametrize("window", [None, 5])
def test_prefill_reference_equals_the_eager_formula(window):
    case = make_case([0, 6], [9, 4])
    out = _prefill(case, paged_attention_prefill_ref, window)
    starts = case.query_start_loc.tolist()
    for b in range(2):
        k, v = dense_kv(case, b)
        q = case.q[starts[b]:starts[b + 1]]
        want = _eager_softcapped(q, k, v, k.shape[0] - q.shape[0], window)
        torch.testing.assert_close(out[starts[b]:starts[b + 1]], want, atol=1e-5, rtol=1e-5)
    uncapped = _prefill(case, paged_attention_prefill_ref, window, soft_cap=None)
    assert (out - uncapped).abs().max() > 1e-2, "the cap must change the result"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("window", [None, 6])
def test_prefill_triton_matches_reference(dtype, window):
    case = make_case([3, 0, 16], [13, 20, 1], block_size=8, dtype=dtype)
    want = _prefill(case, paged_attention_prefill_ref, window)
    got = _prefill(case, paged_attention_prefill_triton, window)
    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=3e-3, rtol=3e-3)
    torch.testing.assert_close(got, want, **tol)


@pytest.mark.parametrize("window", [None, 6])
def test_decode_triton_matches_reference(window):
    case = make_case([0, 16, 39], [1, 1, 1], block_size=4)
    args = (case.q, case.kv_cache, case.seq_lens, case.block_tables, SCALE, window)
    want = paged_attention_decode_ref(*args, soft_cap=CAP)
    got = paged_attention_decode_triton(*args, num_splits=3, soft_cap=CAP)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(want, _prefill(case, paged_attention_prefill_ref, window))


@pytest.mark.parametrize("contexts,queries,window", [
    ([0, 0], [9, 4], None),              # prompts: the torch backend's unmasked causal path
    ([6, 9, 3, 0], [1, 1, 5, 4], 4),     # decodes + chunks over a prefix, sliding window
])
def test_backends_match_the_reference(contexts, queries, window):
    q, k, v, cache, meta = _step(contexts, queries)
    torch_cache, triton_cache = cache.clone(), cache.clone()
    got_torch = TorchAttentionBackend().forward(q, k, v, torch_cache, meta, SCALE, window, CAP)
    got_triton = TritonAttentionBackend(decode_num_splits=2).forward(
        q, k, v, triton_cache, meta, SCALE, window, CAP)
    want = paged_attention_prefill_ref(q, torch_cache, meta.query_start_loc, meta.seq_lens,
                                       meta.block_tables, SCALE, window, CAP)
    torch.testing.assert_close(got_torch, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_triton, want, atol=1e-4, rtol=1e-4)


def test_uncached_forward_applies_the_cap():
    """No KV cache (a profiling pass / plain forward): one causal sequence."""
    q, k, v = torch.randn(7, 4, 16), torch.randn(7, 2, 16), torch.randn(7, 2, 16)
    got = TorchAttentionBackend().forward(q, k, v, None, None, SCALE, None, CAP)
    torch.testing.assert_close(got, _eager_softcapped(q, k, v, 0), atol=1e-5, rtol=1e-5)
