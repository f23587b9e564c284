"""RMSNorm and SiLU-and-mul writing their output in a consumer's column order
(``out_cols``): every path equals the natural-order result gathered, ``ref(x)[..., perm]``,
bit for bit (a scatter store changes no value); the residual sum stays unpermuted."""
from __future__ import annotations

import pytest
import torch

from tamis.engine.layers.activation import SiluAndMul
from tamis.engine.layers.layernorm import RMSNorm
from tamis.kernels.activation import silu_and_mul, silu_and_mul_ref, silu_and_mul_triton
from tamis.kernels.norm import (fused_add_rms_norm, fused_add_rms_norm_ref,
                                fused_add_rms_norm_triton, rms_norm, rms_norm_ref,
                                rms_norm_triton)

DTYPES = [torch.float32, torch.bfloat16]


def _perm(width: int, device="cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """A random permutation and its scatter index (``out_cols = argsort(perm)``)."""
    perm = torch.randperm(width, device=device)
    return perm, torch.argsort(perm)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 8), (3, 96), (2, 3, 100)])
def test_rms_norm_permuted_output(dtype, shape):
    x = torch.randn(shape, dtype=dtype) * 3
    w = torch.randn(shape[-1], dtype=dtype)
    perm, cols = _perm(shape[-1])
    want = rms_norm_ref(x, w, 1e-6)[..., perm]
    for fn in (rms_norm_ref, rms_norm_triton, rms_norm):
        assert torch.equal(fn(x, w, 1e-6, cols), fn(x, w, 1e-6)[..., perm]), fn.__name__
    assert torch.equal(rms_norm_ref(x, w, 1e-6, cols), want)


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_add_rms_norm_permuted_output(dtype):
    x, res = torch.randn(5, 72, dtype=dtype), torch.randn(5, 72, dtype=dtype)
    w = torch.randn(72, dtype=dtype)
    perm, cols = _perm(72)
    for fn in (fused_add_rms_norm_ref, fused_add_rms_norm_triton, fused_add_rms_norm):
        out, summed = fn(x, res, w, 1e-5, cols)
        want_out, want_sum = fn(x, res, w, 1e-5)
        assert torch.equal(out, want_out[..., perm]), fn.__name__
        assert torch.equal(summed, want_sum), fn.__name__   # the residual stays in order


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [8, 1100])   # 1100: two column blocks of the kernel
def test_silu_and_mul_permuted_output(dtype, d):
    x = torch.randn(3, 2 * d, dtype=dtype)
    perm, cols = _perm(d)
    want = silu_and_mul_ref(x)[..., perm]
    for fn in (silu_and_mul_ref, silu_and_mul_triton, silu_and_mul):
        assert torch.equal(fn(x, cols), fn(x)[..., perm]), fn.__name__
    assert torch.equal(silu_and_mul_ref(x, cols), want)


def test_out_cols_of_the_wrong_size_or_dtype_is_refused():
    x, w = torch.randn(2, 8), torch.randn(8)
    with pytest.raises(ValueError, match="int64 permutation of 8 columns"):
        rms_norm_triton(x, w, 1e-6, torch.arange(7))
    with pytest.raises(ValueError, match="int64 permutation of 4 columns"):
        silu_and_mul_triton(x, torch.arange(4, dtype=torch.int32))


def test_modules_permute_output_on_every_path():
    """RMSNorm (with and without residual) and SiluAndMul, through forward (torch) and
    forward_fused (the kernels' dispatchers), give the natural result gathered."""
    norm, act = RMSNorm(48, 1e-6), SiluAndMul()
    norm.weight.data.normal_()
    x, res, gu = torch.randn(4, 48), torch.randn(4, 48), torch.randn(4, 64)
    want_norm, want_pair, want_act = norm(x), norm(x, res), act(gu)
    perm_h, _ = _perm(48)
    perm_d, _ = _perm(32)
    norm.permute_output(perm_h)
    act.permute_output(perm_d)
    for forward in (norm.forward, norm.forward_fused):
        assert torch.equal(forward(x), want_norm[..., perm_h])
        out, summed = forward(x, res)
        assert torch.equal(out, want_pair[0][..., perm_h]) and torch.equal(summed, want_pair[1])
    for forward in (act.forward, act.forward_fused):
        assert torch.equal(forward(gu), want_act[..., perm_d])
    with pytest.raises(ValueError, match="48 entries"):
        norm.permute_output(torch.arange(47))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_permuted_output_kernels_on_cuda():
    """Compiled kernels at a Llama-8B row: scatter stores equal the gathered result."""
    x, res = (torch.randn(64, 4096, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    w = torch.randn(4096, dtype=torch.bfloat16, device="cuda")
    perm, cols = _perm(4096, "cuda")
    out, summed = fused_add_rms_norm(x, res, w, 1e-5, cols)
    want_out, want_sum = fused_add_rms_norm(x, res, w, 1e-5)
    assert torch.equal(out, want_out[..., perm]) and torch.equal(summed, want_sum)
    gu = torch.randn(64, 2 * 14336, dtype=torch.bfloat16, device="cuda")
    perm, cols = _perm(14336, "cuda")
    assert torch.equal(silu_and_mul(gu, cols), silu_and_mul(gu)[..., perm])
