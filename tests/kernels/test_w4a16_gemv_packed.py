"""Packed (bf16x2 / f16x2) W4A16 GEMV against the reference: the plain-Triton twin of the
PTX under the interpreter (indexing, x pairing, zero-point correction, split-K), the PTX
itself on the GPU."""
from __future__ import annotations

import os

import pytest
import torch

from tamis.kernels import w4a16
from tamis.kernels.w4a16_gemv_packed import (PackedGemvConfig, packed_gemv_supported,
                                             pick_packed_gemv_config, w4a16_gemv_packed)
from tamis.quant.packing import pack_int32


def _layout(k, n, group_size, seed, zero_dtype=torch.float16, frac_zeros=False):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (k, n), generator=gen)
    groups = -(-k // group_size)
    scales = (torch.rand(groups, n, generator=gen) * 0.02 + 0.001).half()
    zeros = torch.randint(0, 16, (groups, n), generator=gen).float()
    if frac_zeros:  # the kernel contract allows any float zero point
        zeros = zeros + torch.rand(groups, n, generator=gen)
    return pack_int32(q, 4, dim=0), scales, zeros.to(zero_dtype)


def _check(x, qweight, scales, zeros, group_size, device, rel, **kw):
    expected = w4a16.w4a16_gemm_ref(x.float(), qweight, scales.float(), zeros.float(),
                                    group_size)
    got = w4a16_gemv_packed(x.to(device), qweight.to(device), scales.to(device),
                            zeros.to(device), group_size, **kw)
    assert got.dtype == x.dtype and got.shape == expected.shape
    tol = rel * expected.abs().max().item()
    torch.testing.assert_close(got.float().cpu(), expected, rtol=rel, atol=tol)


_RUNNABLE = os.environ.get("TRITON_INTERPRET") == "1" or torch.cuda.is_available()


@pytest.mark.skipif(not _RUNNABLE, reason="Triton needs CUDA or TRITON_INTERPRET=1")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("k,n,group_size,config", [
    (256, 64, 128, PackedGemvConfig(32, 16, 1, 4, False)),   # no split, no prefetch
    (512, 64, 128, PackedGemvConfig(32, 16, 2, 4, True)),    # split-K, prefetch, even
    (384, 40, 128, PackedGemvConfig(32, 16, 4, 4, True)),    # N tail, 3 uneven splits
    (200, 32, 200, PackedGemvConfig(32, 8, 2, 4, True)),     # one group over K, K tail
    (256, 64, 32, PackedGemvConfig(32, 16, 2, 4, False)),    # group 32: tile shrinks to 4 rows
    (320, 64, 64, PackedGemvConfig(64, 16, 3, 4, True)),     # group 64, K past a group
])
def test_portable_twin_matches_reference(dtype, k, n, group_size, config):
    """Under the interpreter (or on a GPU) the plain-Triton twin, exact fp32 per word."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    qweight, scales, zeros = _layout(k, n, group_size, seed=k + n, frac_zeros=True)
    x = torch.randn(1, k, generator=torch.Generator().manual_seed(k)).to(dtype)
    _check(x, qweight, scales, zeros, group_size, device, 8e-3, config=config, use_asm=False)


def test_support_and_config():
    bf16 = torch.bfloat16
    assert packed_gemv_supported(1, 4096, 128, 4, bf16)
    assert packed_gemv_supported(1, 4096, 128, 4, torch.float16)
    assert not packed_gemv_supported(1, 4096, 128, 4, torch.float32)  # fp32 activations
    assert not packed_gemv_supported(1, 4096, 128, 8, bf16)           # 8-bit
    assert not packed_gemv_supported(2, 4096, 128, 4, bf16)           # two rows
    assert not packed_gemv_supported(1, 100, 20, 4, bf16)             # K % 8, partial words
    few, many = pick_packed_gemv_config(4096, 4096), pick_packed_gemv_config(28672, 4096)
    assert few.split_k > many.split_k >= 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("k,n,group_size,config", [
    (4096, 1024, 128, None),
    (4096, 1000, 128, PackedGemvConfig(256, 16, 8, 4, True)),   # N tail
    (1024, 256, 64, PackedGemvConfig(128, 16, 3, 8, True)),     # uneven splits, group 64
    (1000, 256, 1000, PackedGemvConfig(128, 16, 2, 4, False)),  # K tail, one group
])
def test_ptx_matches_reference_on_cuda(dtype, k, n, group_size, config):
    """The PTX path: 4 products per word summed in bf16 (f16) first, hence the looser
    bf16 bound (measured error is printed by bench_quant.py gemm)."""
    for seed in range(3):  # fresh inputs per check
        qweight, scales, zeros = _layout(k, n, group_size, seed=seed, frac_zeros=seed == 2)
        x = torch.randn(1, k, generator=torch.Generator().manual_seed(seed)).to(dtype)
        _check(x, qweight, scales, zeros, group_size, "cuda",
               2e-2 if dtype == torch.bfloat16 else 8e-3, config=config)
