"""FP8 (e4m3) KV cache: quantizing stores and dequantizing paged attention, Triton kernels
(interpreted on CPU) against the references, and the references against attention over the
dequantized cache."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from paged_cases import make_case  # noqa: E402
from test_triton_backend import _step  # noqa: E402

from tamis.engine.attention.torch_backend import TorchAttentionBackend, store_kv  # noqa: E402
from tamis.engine.attention.triton_backend import TritonAttentionBackend  # noqa: E402
from tamis.kernels.attention_decode import (paged_attention_decode_ref,  # noqa: E402
                                            paged_attention_decode_triton)
from tamis.kernels.attention_prefill import (paged_attention_prefill_ref,  # noqa: E402
                                             paged_attention_prefill_triton)
from tamis.kernels.cache import (FP8_E4M3_MAX, quantize_kv, store_kv_cache_ref,  # noqa: E402
                                 store_kv_cache_triton)

FP8 = torch.float8_e4m3fn
K_SCALE, V_SCALE = 0.05, 0.03


def _fp8_cache(cache: torch.Tensor) -> torch.Tensor:
    """cache quantized with K_SCALE for keys and V_SCALE for values."""
    return torch.stack([quantize_kv(cache[0], K_SCALE, FP8), quantize_kv(cache[1], V_SCALE, FP8)])


def _dequantized(fp8_cache: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    return torch.stack([fp8_cache[0].float() * K_SCALE, fp8_cache[1].float() * V_SCALE]).to(dtype)


def _bits(cache: torch.Tensor) -> torch.Tensor:
    return cache.view(torch.uint8)


def test_quantize_divides_by_the_scale_and_clamps_to_e4m3():
    x = torch.tensor([0.0, 1.0, -2.5, 1e4, -1e4, 3.3])
    got = quantize_kv(x, 0.5, FP8).float()
    assert torch.isfinite(got).all(), "out-of-range values clamp instead of becoming NaN"
    assert got[3] == FP8_E4M3_MAX and got[4] == -FP8_E4M3_MAX
    assert got[:3].tolist() == [0.0, 2.0, -5.0]
    assert abs(got[5] - 6.6) <= 0.25   # e4m3 has 3 mantissa bits: 6.6 rounds to 6.5


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_store_triton_writes_the_reference_bytes(dtype):
    tokens, heads, dim = 9, 2, 16
    key = torch.randn(tokens, heads, dim, dtype=dtype) * 4
    value = torch.randn(tokens, heads, dim, dtype=dtype) * 4
    slots = torch.randperm(6 * 4)[:tokens]
    slots[[2, 5]] = -1                     # padding tokens: not stored
    want = torch.zeros(2, 6, 4, heads, dim, dtype=FP8)
    got, backend = want.clone(), want.clone()
    store_kv_cache_ref(key, value, want, slots, K_SCALE, V_SCALE)
    store_kv_cache_triton(key, value, got, slots, K_SCALE, V_SCALE)
    store_kv(key, value, backend, slots, K_SCALE, V_SCALE)
    assert torch.equal(_bits(got), _bits(want))
    assert torch.equal(_bits(backend), _bits(want))
    stored = want[0].view(-1, heads, dim)[slots[0]].float() * K_SCALE
    # Relative error 2^-4 for normal e4m3 values; below 2^-6 the subnormal step 2^-9 is
    # absolute, so rounding may be off by half of it (times the scale).
    torch.testing.assert_close(stored, key[0].float(), atol=2 ** -10 * K_SCALE, rtol=2 ** -4)
    assert int((_bits(want) != 0).any(dim=(0, 3, 4)).sum()) == tokens - 2


def test_store_triton_rounds_like_torch_over_the_whole_e4m3_range():
    """Every e4m3 value, the midpoints between neighbours (ties to even), random values
    from subnormals to past 448, both signs: the kernel's bytes equal torch's cast."""
    grid = torch.arange(256, dtype=torch.uint8).view(FP8).float()
    grid = grid[torch.isfinite(grid)].sort().values
    midpoints = (grid[1:] + grid[:-1]) / 2
    random = torch.exp2(torch.empty(1024).uniform_(-12, 9)) * torch.randn(1024).sign()
    values = torch.cat([grid, midpoints, random, torch.tensor([1e4, -1e4])])
    values = torch.cat([values, torch.zeros(-len(values) % 32)]).view(-1, 1, 32)
    slots = torch.arange(values.shape[0])
    want = torch.zeros(2, values.shape[0], 1, 1, 32, dtype=FP8)
    got = want.clone()
    store_kv_cache_ref(values, -values, want, slots)
    store_kv_cache_triton(values, -values, got, slots)
    assert torch.equal(_bits(got), _bits(want))


@pytest.mark.parametrize("contexts,queries,block_size", [
    ([0, 0], [17, 5], 4),
    ([3, 16, 0], [13, 1, 33], 16),
])
def test_prefill_reads_fp8_as_the_dequantized_cache(contexts, queries, block_size):
    case = make_case(contexts, queries, block_size=block_size)
    fp8 = _fp8_cache(case.kv_cache)
    args = (case.query_start_loc, case.seq_lens, case.block_tables, 0.3)
    want = paged_attention_prefill_ref(case.q, _dequantized(fp8), *args)
    ref = paged_attention_prefill_ref(case.q, fp8, *args, k_scale=K_SCALE, v_scale=V_SCALE)
    torch.testing.assert_close(ref, want, atol=1e-6, rtol=1e-6)
    for dtype, tol in ((torch.float32, 1e-4), (torch.float16, 3e-3)):
        got = paged_attention_prefill_triton(case.q.to(dtype), fp8, *args,
                                             max_query_len=case.max_query_len,
                                             k_scale=K_SCALE, v_scale=V_SCALE)
        torch.testing.assert_close(got.float(), want, atol=tol, rtol=tol)


@pytest.mark.parametrize("window", [None, 5])
def test_decode_reads_fp8_as_the_dequantized_cache(window):
    case = make_case([6, 30, 2, 0], [1, 1, 1, 1], num_heads=8, num_kv_heads=2)
    fp8 = _fp8_cache(case.kv_cache)
    args = (case.seq_lens, case.block_tables, 0.25, window)
    want = paged_attention_decode_ref(case.q, _dequantized(fp8), *args)
    ref = paged_attention_decode_ref(case.q, fp8, *args, k_scale=K_SCALE, v_scale=V_SCALE)
    torch.testing.assert_close(ref, want, atol=1e-6, rtol=1e-6)
    for dtype, tol in ((torch.float32, 1e-4), (torch.float16, 3e-3)):
        got = paged_attention_decode_triton(case.q.to(dtype), fp8, *args, num_splits=3,
                                            k_scale=K_SCALE, v_scale=V_SCALE)
        torch.testing.assert_close(got.float(), want, atol=tol, rtol=tol)


def test_fp8_attention_stays_close_to_full_precision():
    case = make_case([3, 16, 0], [13, 1, 33], block_size=16)
    args = (case.query_start_loc, case.seq_lens, case.block_tables, 0.3)
    exact = paged_attention_prefill_ref(case.q, case.kv_cache, *args)
    fp8 = paged_attention_prefill_ref(case.q, _fp8_cache(case.kv_cache), *args,
                                      k_scale=K_SCALE, v_scale=V_SCALE)
    error = (fp8 - exact).norm() / exact.norm()
    assert error < 0.05, f"relative error {error:.3f} of attention over an e4m3 cache"


@pytest.mark.parametrize("contexts,queries", [
    ([5, 12, 0], [1, 7, 3]),      # decode row + chunk over a prefix + prompt
    ([6, 9, 3, 0], [1, 1, 5, 4]),  # two leading decodes (decode kernel) + chunks
    ([6, 30, 2], [1, 1, 1]),      # decode-only
])
def test_triton_backend_matches_torch_backend_on_fp8(contexts, queries):
    q, k, v, cache, meta = _step(contexts, queries)
    cache = _fp8_cache(cache)
    torch_cache = cache.clone()
    scales = dict(k_scale=K_SCALE, v_scale=V_SCALE)
    want = TorchAttentionBackend().forward(q, k, v, torch_cache, meta, 0.25, **scales)
    got = TritonAttentionBackend(decode_num_splits=2).forward(q, k, v, cache, meta, 0.25,
                                                              **scales)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert torch.equal(_bits(cache), _bits(torch_cache)), "both must store the same bytes"


@pytest.mark.gpu
def test_fp8_cache_real_shapes_on_gpu():
    """Compiled kernels, Llama-3.1-8B heads, bf16 queries: the store writes torch's bytes and
    decode / prefill over the e4m3 cache equal the reference."""
    case = make_case([0, 100, 1000, 2047, 15], [512, 1, 300, 1, 64], num_heads=32,
                     num_kv_heads=8, head_dim=128, block_size=16, dtype=torch.bfloat16,
                     device="cuda")
    key = torch.randn(777, 8, 128, dtype=torch.bfloat16, device="cuda") * 10
    value = torch.randn_like(key) * 10
    slots = torch.randperm(case.kv_cache[0, :, :, 0, 0].numel(), device="cuda")[:777]
    want, got = torch.zeros_like(case.kv_cache, dtype=FP8), torch.zeros_like(case.kv_cache, dtype=FP8)
    store_kv_cache_ref(key, value, want, slots, K_SCALE, V_SCALE)
    store_kv_cache_triton(key, value, got, slots, K_SCALE, V_SCALE)
    assert torch.equal(_bits(got), _bits(want))

    fp8 = _fp8_cache(case.kv_cache)
    scales = dict(k_scale=K_SCALE, v_scale=V_SCALE)
    args = (case.query_start_loc, case.seq_lens, case.block_tables, 128 ** -0.5)
    torch.testing.assert_close(
        paged_attention_prefill_triton(case.q, fp8, *args, max_query_len=case.max_query_len,
                                       **scales),
        paged_attention_prefill_ref(case.q, fp8, *args, **scales), atol=2e-2, rtol=2e-2)
    decode = make_case([1, 17, 2048, 4000], [1, 1, 1, 1], num_heads=32, num_kv_heads=8,
                       head_dim=128, block_size=16, dtype=torch.bfloat16, device="cuda")
    fp8 = _fp8_cache(decode.kv_cache)
    args = (decode.seq_lens, decode.block_tables, 128 ** -0.5)
    torch.testing.assert_close(paged_attention_decode_triton(decode.q, fp8, *args, **scales),
                               paged_attention_decode_ref(decode.q, fp8, *args, **scales),
                               atol=2e-2, rtol=2e-2)
