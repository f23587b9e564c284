"""INT8 W8A8 (compressed-tensors ``int-quantized``): per-token activation quantization
and the int8 matmul with int32 accumulation.

```
weight        int8 [N, K], symmetric        w[n, k] = weight[n, k] * weight_scale[n]
weight_scale  float32 [N]
x             [M, K] -> x_q int8 [M, K], x_scale float32 [M, 1]
              x_scale = amax(row) / 127, x_q = round(x / x_scale)  (half to even)
y[m, n] = x_scale[m] * weight_scale[n] * sum_k x_q[m, k] * weight[n, k]   (exact in int32)
```
- ``per_token_quant_int8`` (Triton on CUDA, ``_ref`` otherwise) computes the scales
  and codes above.
- ``int8_scaled_mm_ref``: the integer dot computed exactly (float64 holds any int8 dot
  of K < 2**38 terms exactly), then the scales: the reference for the kernel.
- ``int8_scaled_mm_triton``: ``tl.dot`` on int8 with int32 accumulation, scales in the
  epilogue (``kernels/scaled_mm.py``).
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

from tamis.kernels._triton import kernel, next_power_of_2, triton_available, use_triton
from tamis.kernels.scaled_mm import scaled_mm_triton

if triton_available():
    import triton.language as tl

INT8_MAX = 127.0
_MIN_SCALE = 1e-10 / INT8_MAX  # keeps all-zero rows finite


def per_token_quant_int8_ref(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (int8 [M, K], float32 scales [M, 1]), symmetric, one scale per row."""
    x = x.float()
    scale = (x.abs().amax(dim=-1, keepdim=True) / INT8_MAX).clamp(min=_MIN_SCALE)
    q = torch.round(x / scale).clamp(-128, INT8_MAX).to(torch.int8)
    return q, scale


@kernel
def _per_token_quant_int8_kernel(x_ptr, q_ptr, s_ptr, K, stride_x, stride_q,
                                 MIN_SCALE: tl.constexpr, BLOCK: tl.constexpr):
    """One program per row, the whole row in registers (one read of x, as SGLang's
    per_token_quant_int8)."""
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < K
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    # div_rn: IEEE division as torch does it (Triton's "/" on fp32 is approximate).
    scale = tl.maximum(tl.math.div_rn(tl.max(tl.abs(x), axis=0), 127.0), MIN_SCALE)
    # Adding and removing 1.5 * 2**23 rounds |v| < 2**22 half to even, as torch.round
    # does (libdevice's rint has no interpreter version).
    rounded = (tl.math.div_rn(x, scale) + 12582912.0) - 12582912.0
    q = tl.clamp(rounded, -128.0, 127.0)
    tl.store(q_ptr + row * stride_q + offs, q.to(tl.int8), mask=mask)
    tl.store(s_ptr + row, scale)


def per_token_quant_int8_triton(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton path of ``per_token_quant_int8_ref`` (same contract); x must be 2-D."""
    m, k = x.shape
    q = torch.empty((m, k), dtype=torch.int8, device=x.device)
    scale = torch.empty((m, 1), dtype=torch.float32, device=x.device)
    block = next_power_of_2(k)
    _per_token_quant_int8_kernel[(m,)](x, q, scale, k, x.stride(0), q.stride(0),
                                       MIN_SCALE=_MIN_SCALE, BLOCK=block,
                                       num_warps=min(max(block // 256, 1), 8))
    return q, scale


def per_token_quant_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if use_triton(x) and x.numel():
        return per_token_quant_int8_triton(x)
    return per_token_quant_int8_ref(x)


def int8_scaled_mm_ref(x_q: torch.Tensor, x_scale: torch.Tensor, weight: torch.Tensor,
                       weight_scale: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """The module formula: exact integer dot, then ``x_scale * weight_scale`` in fp32."""
    dots = (x_q.double() @ weight.double().t()).float()
    return (dots * x_scale.float().reshape(-1, 1) * weight_scale.float().reshape(1, -1)).to(out_dtype)


def int8_scaled_mm_triton(x_q: torch.Tensor, x_scale: torch.Tensor, weight: torch.Tensor,
                          weight_scale: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """Triton path of ``int8_scaled_mm_ref`` (same contract; exact up to fp32 rounding
    of the scaled result)."""
    return scaled_mm_triton(x_q, weight, x_scale, weight_scale, out_dtype)


def int8_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] -> [..., N] in x's dtype: W8A8 with dynamic per-token activations."""
    n, k = weight.shape
    x_q, x_scale = per_token_quant_int8(x.reshape(-1, k))
    matmul = int8_scaled_mm_triton if use_triton(x) and x.numel() else int8_scaled_mm_ref
    out = matmul(x_q, x_scale, weight, weight_scale, x.dtype)
    if bias is not None:
        out = out + bias.to(out.dtype)
    return out.reshape(*x.shape[:-1], n)
