"""Paged attention (prefill over cached prefix + decode split-K): Triton against reference,
and the reference against dense causal SDPA."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
from paged_cases import dense_kv, make_case  # noqa: E402

from tamis.kernels.attention_decode import (paged_attention_decode,  # noqa: E402
                                            paged_attention_decode_ref,
                                            paged_attention_decode_triton)
from tamis.kernels.attention_prefill import (paged_attention_prefill,  # noqa: E402
                                             paged_attention_prefill_ref,
                                             paged_attention_prefill_triton)


def _tol(dtype):
    return dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=3e-3, rtol=3e-3)


def _prefill(case, impl, scale, window=None):
    args = (case.q, case.kv_cache, case.query_start_loc, case.seq_lens, case.block_tables, scale)
    if impl is paged_attention_prefill_triton:
        return impl(*args, window, case.max_query_len)
    return impl(*args, window)


def test_prefill_reference_matches_dense_causal_sdpa():
    case = make_case([0, 5, 9], [7, 3, 1], num_heads=4, num_kv_heads=2)
    scale = 0.3
    out = _prefill(case, paged_attention_prefill_ref, scale)
    starts = case.query_start_loc.tolist()
    for b in range(3):
        k, v = dense_kv(case, b)
        seq_len = k.shape[0]
        qlen = starts[b + 1] - starts[b]
        # Queries at the last qlen positions of a full causal pass.
        full_q = torch.randn(seq_len, 4, 16)
        full_q[seq_len - qlen:] = case.q[starts[b]:starts[b + 1]]
        want = F.scaled_dot_product_attention(
            full_q.transpose(0, 1), k.repeat_interleave(2, 1).transpose(0, 1),
            v.repeat_interleave(2, 1).transpose(0, 1), is_causal=True, scale=scale)
        torch.testing.assert_close(out[starts[b]:starts[b + 1]],
                                   want.transpose(0, 1)[seq_len - qlen:], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("contexts,queries,block_size", [
    ([0], [1], 4),                       # a single token
    ([0, 0], [17, 5], 4),                # pure prefill, odd lengths, block boundaries
    ([3, 16, 0], [13, 1, 33], 16),       # chunk over a cached prefix, decode row, long prompt
    ([31, 7], [2, 9], 8),
])
def test_prefill_triton_matches_reference(dtype, contexts, queries, block_size):
    case = make_case(contexts, queries, block_size=block_size, dtype=dtype)
    want = _prefill(case, paged_attention_prefill_ref, 0.25)
    got = _prefill(case, paged_attention_prefill_triton, 0.25)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, **_tol(dtype))


@pytest.mark.parametrize("window", [1, 5, 16])
def test_prefill_sliding_window(window):
    case = make_case([20, 0], [6, 25], block_size=4, num_heads=2, num_kv_heads=1)
    want = _prefill(case, paged_attention_prefill_ref, 0.25, window)
    got = _prefill(case, paged_attention_prefill_triton, 0.25, window)
    torch.testing.assert_close(got, want, **_tol(torch.float32))
    if window == 1:   # each query sees only itself: the output is its own value row
        _, v = dense_kv(case, 1)
        torch.testing.assert_close(got[6:], v.repeat_interleave(2, 1), atol=1e-5, rtol=1e-5)


def test_cache_in_another_dtype_is_read_as_q_dtype():
    case = make_case([9, 0], [4, 6], block_size=4, dtype=torch.float32)
    q16 = case.q.half()
    want = paged_attention_prefill_ref(q16, case.kv_cache, case.query_start_loc, case.seq_lens,
                                       case.block_tables, 0.3)
    got = paged_attention_prefill_triton(q16, case.kv_cache, case.query_start_loc, case.seq_lens,
                                         case.block_tables, 0.3, max_query_len=6)
    torch.testing.assert_close(got, want, **_tol(torch.float16))
    dec = _decode_case([7, 13], torch.float32, block_size=4)
    args = (dec.q.half(), dec.kv_cache, dec.seq_lens, dec.block_tables, 0.3)
    torch.testing.assert_close(paged_attention_decode_triton(*args, num_splits=2),
                               paged_attention_decode_ref(*args), **_tol(torch.float16))


def test_prefill_gqa_group_of_eight_and_head_dim_not_power_of_two():
    case = make_case([5], [11], num_heads=8, num_kv_heads=1, head_dim=24, block_size=4)
    torch.testing.assert_close(_prefill(case, paged_attention_prefill_triton, 0.2),
                               _prefill(case, paged_attention_prefill_ref, 0.2))


def _decode_case(seq_lens, dtype=torch.float32, **kw):
    return make_case([s - 1 for s in seq_lens], [1] * len(seq_lens), dtype=dtype, **kw)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("seq_lens,num_splits", [([1], 1), ([1, 2, 17, 40], 3), ([64, 5], 4),
                                                 ([33], 8)])
def test_decode_triton_matches_reference(dtype, seq_lens, num_splits):
    case = _decode_case(seq_lens, dtype, block_size=4)
    want = paged_attention_decode_ref(case.q, case.kv_cache, case.seq_lens, case.block_tables, 0.3)
    got = paged_attention_decode_triton(case.q, case.kv_cache, case.seq_lens, case.block_tables,
                                        0.3, num_splits=num_splits)
    torch.testing.assert_close(got, want, **_tol(dtype))


def test_decode_equals_prefill_with_one_query():
    case = _decode_case([9, 30, 4])
    prefill = _prefill(case, paged_attention_prefill_ref, 0.3)
    decode = paged_attention_decode_ref(case.q, case.kv_cache, case.seq_lens, case.block_tables, 0.3)
    torch.testing.assert_close(decode, prefill)


def test_decode_padding_rows_give_zeros_and_leave_others_alone():
    case = _decode_case([12, 7], block_size=4)
    seq_lens = case.seq_lens.clone()
    seq_lens[1] = 0      # a padding row of a captured batch
    got = paged_attention_decode_triton(case.q, case.kv_cache, seq_lens, case.block_tables, 0.3,
                                        num_splits=2)
    want = paged_attention_decode_ref(case.q, case.kv_cache, seq_lens, case.block_tables, 0.3)
    assert torch.equal(got[1], torch.zeros_like(got[1]))
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("window", [1, 6])
def test_decode_sliding_window(window):
    case = _decode_case([3, 21, 40], block_size=4)
    want = paged_attention_decode_ref(case.q, case.kv_cache, case.seq_lens, case.block_tables,
                                      0.3, window)
    got = paged_attention_decode_triton(case.q, case.kv_cache, case.seq_lens, case.block_tables,
                                        0.3, window, num_splits=3)
    torch.testing.assert_close(got, want)


def test_dispatchers_use_reference_on_cpu():
    case = _decode_case([5, 9])
    args = (case.q, case.kv_cache, case.seq_lens, case.block_tables, 0.3)
    assert torch.equal(paged_attention_decode(*args), paged_attention_decode_ref(*args))
    pargs = (case.q, case.kv_cache, case.query_start_loc, case.seq_lens, case.block_tables, 0.3)
    assert torch.equal(paged_attention_prefill(*pargs), paged_attention_prefill_ref(*pargs))


def test_bad_shapes_are_named():
    case = _decode_case([5])
    with pytest.raises(ValueError, match="multiple of KV heads"):
        paged_attention_decode(case.q[:, :3], case.kv_cache, case.seq_lens, case.block_tables, 1.0)
    with pytest.raises(ValueError, match="kv_cache"):
        paged_attention_decode(case.q, case.kv_cache[0], case.seq_lens, case.block_tables, 1.0)


@pytest.mark.gpu
@pytest.mark.parametrize("block_size", [16, 32])
def test_attention_real_shapes_on_gpu(block_size):
    dt = torch.bfloat16
    contexts = [0, 100, 1000, 2047, 15, 0]
    queries = [512, 1, 300, 1, 64, 1]
    case = make_case(contexts, queries, num_heads=32, num_kv_heads=8, head_dim=128,
                     block_size=block_size, dtype=dt, device="cuda")
    scale = 128 ** -0.5
    want = _prefill(case, paged_attention_prefill_ref, scale)
    got = _prefill(case, paged_attention_prefill_triton, scale)
    torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)
    got_w = _prefill(case, paged_attention_prefill_triton, scale, 256)
    torch.testing.assert_close(got_w, _prefill(case, paged_attention_prefill_ref, scale, 256),
                               atol=2e-2, rtol=2e-2)
    dec = _decode_case([1, 17, 2048, 4000, 333, 64], dt, num_heads=32, num_kv_heads=8,
                       head_dim=128, block_size=block_size, device="cuda")
    args = (dec.q, dec.kv_cache, dec.seq_lens, dec.block_tables, scale)
    torch.testing.assert_close(paged_attention_decode(*args), paged_attention_decode_ref(*args),
                               atol=2e-2, rtol=2e-2)
