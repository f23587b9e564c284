"""INT8 W8A8 (compressed-tensors ``int-quantized``): per-token activation quantization
and the int8 matmul with int32 accumulation.

```
weight        int8 [N, K], symmetric        w[n, k] = weight[n, k] * weight_scale[n]
weight_scale  float32 [N]
x             [M, K] -> x_q int8 [M, K], x_scale float32 [M, 1]
              x_scale = amax(row) / 127, x_q = round(x / x_scale)  (half to even)
y[m, n] = x_scale[m] * weight_scale[n] * sum_k x_q[m, k] * weight[n, k]   (exact in int32)
```
- ``int8_scaled_mm_ref``: the integer dot computed exactly (float64 holds any int8 dot
  of K < 2**38 terms exactly), then the scales: the reference for the kernel.
- ``int8_scaled_mm_triton``: ``tl.dot`` on int8 with int32 accumulation, scales in the
  epilogue.
- The activation scale is vLLM's amax / 127. compressed-tensors' own forward divides by
  127.5 ((q_max - q_min) / 2), which puts each row's largest element exactly on a rounding
  tie (-127.5 -> -128, but -127.49999 -> -127): one ulp upstream then moves a whole code
  of the row's largest value. amax / 127 lands it on a code and is the grid vLLM serves.
- ``int8_linear`` dispatches: the Triton kernel on CUDA, the reference elsewhere (CPU).
  Both quantize the activations the same way, which is what compressed-tensors' own
  forward does (fake-quantized activations against the dequantized weight).
"""
from __future__ import annotations

import torch

from tamis.kernels._triton import kernel, use_triton

try:
    import triton.language as tl
except ImportError:  # CPU-only installs without triton
    tl = None

INT8_MAX = 127.0
_MIN_SCALE = 1e-10 / INT8_MAX  # keeps all-zero rows finite


def per_token_quant_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (int8 [M, K], float32 scales [M, 1]), symmetric, one scale per row."""
    x = x.float()
    scale = (x.abs().amax(dim=-1, keepdim=True) / INT8_MAX).clamp(min=_MIN_SCALE)
    q = torch.round(x / scale).clamp(-128, INT8_MAX).to(torch.int8)
    return q, scale


def int8_scaled_mm_ref(x_q: torch.Tensor, x_scale: torch.Tensor, weight: torch.Tensor,
                       weight_scale: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """The module formula: exact integer dot, then ``x_scale * weight_scale`` in fp32."""
    dots = (x_q.double() @ weight.double().t()).float()
    return (dots * x_scale.float().reshape(-1, 1) * weight_scale.float().reshape(1, -1)).to(out_dtype)


@kernel
def _int8_scaled_mm_kernel(a_ptr, b_ptr, c_ptr, as_ptr, bs_ptr, M, N, K,
                           stride_am, stride_bn, stride_cm,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """C[M, N] = (A[M, K] @ B[N, K].T in int32) * a_s[M] * b_s[N]."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m = offs_m < M
    mask_n = offs_n < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + offs_k
        a = tl.load(a_ptr + offs_m[:, None] * stride_am + ks[None, :],
                    mask=mask_m[:, None] & (ks[None, :] < K), other=0)
        b = tl.load(b_ptr + offs_n[None, :] * stride_bn + ks[:, None],
                    mask=mask_n[None, :] & (ks[:, None] < K), other=0)
        acc += tl.dot(a, b, out_dtype=tl.int32)
    a_s = tl.load(as_ptr + offs_m, mask=mask_m, other=0.0)
    b_s = tl.load(bs_ptr + offs_n, mask=mask_n, other=0.0)
    out = acc.to(tl.float32) * a_s[:, None] * b_s[None, :]
    tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :],
             out.to(c_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


def _tiles(m: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K): narrow row tiles for decode-sized M."""
    return (16 if m <= 16 else (32 if m <= 32 else 64)), 128, 64


def int8_scaled_mm_triton(x_q: torch.Tensor, x_scale: torch.Tensor, weight: torch.Tensor,
                          weight_scale: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """Triton path of ``int8_scaled_mm_ref`` (same contract; exact up to fp32 rounding
    of the scaled result)."""
    m, k = x_q.shape
    n = weight.shape[0]
    x_q, weight = x_q.contiguous(), weight.contiguous()
    x_scale = x_scale.float().reshape(-1).contiguous()
    weight_scale = weight_scale.float().reshape(-1).contiguous()
    out = torch.empty((m, n), dtype=out_dtype, device=x_q.device)
    block_m, block_n, block_k = _tiles(m)
    grid = (-(-m // block_m), -(-n // block_n))
    _int8_scaled_mm_kernel[grid](x_q, weight, out, x_scale, weight_scale, m, n, k,
                                 x_q.stride(0), weight.stride(0), out.stride(0),
                                 BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k)
    return out


def int8_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] -> [..., N] in x's dtype: W8A8 with dynamic per-token activations."""
    n, k = weight.shape
    x_q, x_scale = per_token_quant_int8(x.reshape(-1, k))
    matmul = int8_scaled_mm_triton if use_triton(x) else int8_scaled_mm_ref
    out = matmul(x_q, x_scale, weight, weight_scale, x.dtype)
    if bias is not None:
        out = out + bias.to(out.dtype)
    return out.reshape(*x.shape[:-1], n)
