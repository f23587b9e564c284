"""W4A16 dequant-GEMM: Triton kernel (interpreted on CPU, fp16/fp32) against the reference,
and the reference against an independent per-element dequantization."""
from __future__ import annotations

import os

import pytest
import torch

from tamis.kernels import w4a16
from tamis.quant.packing import pack_int32


def _random_layout(k, n, group_size, bits, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 2**bits, (k, n), generator=gen)
    groups = -(-k // group_size)
    scales = (torch.rand(groups, n, generator=gen) * 0.02 + 0.001).to(dtype)
    zeros = torch.randint(0, 2**bits, (groups, n), generator=gen).to(dtype)
    return q, pack_int32(q, bits, dim=0), scales, zeros


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("k,group_size", [(64, 32), (96, 64), (80, 80)])
def test_reference_matches_elementwise_formula(bits, k, group_size):
    n = 24
    q, qweight, scales, zeros = _random_layout(k, n, group_size, bits, torch.float32)
    expected = torch.empty(k, n)
    for row in range(k):
        g = row // group_size
        expected[row] = (q[row].float() - zeros[g]) * scales[g]
    got = w4a16.dequantize_wna16(qweight, scales, zeros, group_size, bits, k)
    assert torch.equal(got, expected)


def _interpreted():
    return os.environ.get("TRITON_INTERPRET") == "1"


@pytest.mark.skipif(not _interpreted() and not torch.cuda.is_available(),
                    reason="Triton needs CUDA or TRITON_INTERPRET=1")
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("m,k,n,group_size,bits,config", [
    (3, 64, 48, 32, 4, w4a16.GemmConfig(16, 32, 32, 1, 4, 1)),     # aligned groups, N tail
    (5, 80, 32, 32, 4, w4a16.GemmConfig(16, 32, 32, 2, 4, 1)),     # K tail (ceil groups), split-K
    (17, 64, 32, 16, 4, w4a16.GemmConfig(16, 32, 32, 1, 4, 1)),    # group < BLOCK_K: gather path
    (4, 64, 32, 64, 8, w4a16.GemmConfig(16, 32, 32, 1, 4, 1)),     # 8-bit
])
def test_triton_matches_reference(dtype, m, k, n, group_size, bits, config):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    _, qweight, scales, zeros = _random_layout(k, n, group_size, bits, dtype, seed=m)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(1)).to(dtype)
    expected = w4a16.w4a16_gemm_ref(x.float(), qweight, scales.float(), zeros.float(),
                                    group_size, bits)
    got = w4a16.w4a16_gemm_triton(x.to(device), qweight.to(device), scales.to(device),
                                  zeros.to(device), group_size, bits, config=config)
    # fp32 tl.dot runs as tf32 on the GPU (exact fp32 only under the interpreter).
    tol = 2e-2 if dtype == torch.float16 or device == "cuda" else 1e-4
    torch.testing.assert_close(got.float().cpu(), expected, rtol=tol, atol=tol)


@pytest.mark.skipif(not _interpreted() and not torch.cuda.is_available(),
                    reason="Triton needs CUDA or TRITON_INTERPRET=1")
@pytest.mark.parametrize("m", [2, 40])
def test_dispatcher_tile_choice_is_correct(m):
    """The decode and mid-M tiles ``pick_config`` chooses (group 128, K tail past a group)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    k, n, group_size = 320, 64, 128
    _, qweight, scales, zeros = _random_layout(k, n, group_size, 4, torch.float16, seed=m)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(2)).half()
    expected = w4a16.w4a16_gemm_ref(x.float(), qweight, scales.float(), zeros.float(), group_size)
    got = w4a16.w4a16_gemm_triton(x.to(device), qweight.to(device), scales.to(device),
                                  zeros.to(device), group_size)
    torch.testing.assert_close(got.float().cpu(), expected, rtol=2e-2, atol=2e-2)
