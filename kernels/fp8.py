"""FP8 (e4m3) activation quantization and scaled matmul.

```
weight        float8_e4m3fn [N, K]
weight_scale  float32 [N] (per output channel; a per-tensor scale is expanded to N)
input_scale   float32 scalar for static activations, None for dynamic per-token
y = (x_q * x_scale) @ (weight * weight_scale).T + bias
```

- ``per_token_quant_fp8`` (Triton on CUDA; ``per_token_quant_fp8_ref`` otherwise): one
  scale per row, ``amax(row) / 448``.
- ``fp8_gemv_triton``: W8A16 for M <= ``gemv.GEMV_MAX_M`` (decode): the row-streaming
  GEMV of ``tamis.kernels.gemv`` on the e4m3 weights (converted in registers, per-channel
  scale applied once at the end). No activation quantization, so the weight bytes are all it
  reads.
- ``fp8_linear`` dispatches: on CUDA, M <= ``GEMV_DISPATCH_M`` runs that GEMV (any CUDA GPU);
  larger M on a GPU with FP8 (compute capability >= 8.9) runs W8A8: on Hopper for
  ``fp8_mm.FP8_MM_ROWS`` rows through ``tamis.kernels.fp8_mm`` (tiles sized to fill the
  multiprocessors at decode batches), otherwise through ``torch._scaled_mm``; anything
  else runs W8A16 (the weight upcast to x's dtype), which is also the CPU reference.
  ``fp8_linear_ref`` emulates W8A8 exactly in fp32.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from tamis.kernels.fp8_mm import FP8_MM_ROWS, fp8_mm_triton
from tamis.kernels.gemv import GemvTiles, gemv_triton
from tamis.kernels.w4a16_common import cuda_capability

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)  # 448
_MIN_SCALE = 1.0 / (FP8_MAX * 512.0)  # keeps all-zero rows finite


def fp8_supported(device: torch.device | str) -> bool:
    """True on CUDA devices whose tensor cores take FP8 (Ada, Hopper and later)."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    return torch.cuda.get_device_capability(device) >= (8, 9)


def quantize_fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x / scale saturated to the e4m3 range (scale broadcasts against x)."""
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def per_token_quant_fp8_ref(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (float8 [M, K], float32 scales [M, 1])."""
    scale = (x.float().abs().amax(dim=-1, keepdim=True) / FP8_MAX).clamp(min=_MIN_SCALE)
    return quantize_fp8(x, scale), scale


if triton is not None:

    @triton.jit
    def _per_token_quant_kernel(x_ptr, q_ptr, s_ptr, K, stride_x, stride_q,
                                FP8_MAX_C: tl.constexpr, MIN_SCALE: tl.constexpr,
                                BLOCK: tl.constexpr):
        row = tl.program_id(0)
        amax = tl.zeros((BLOCK,), dtype=tl.float32)
        for k0 in range(0, K, BLOCK):
            offs = k0 + tl.arange(0, BLOCK)
            x = tl.load(x_ptr + row * stride_x + offs, mask=offs < K, other=0.0)
            amax = tl.maximum(amax, tl.abs(x.to(tl.float32)))
        # IEEE quotients (div_rn), as torch computes them: Triton's `/` is approximate on
        # CUDA, and one ulp moves some quotients across an e4m3 rounding boundary.
        scale = tl.maximum(tl.math.div_rn(tl.max(amax, axis=0), FP8_MAX_C), MIN_SCALE)
        tl.store(s_ptr + row, scale)
        for k0 in range(0, K, BLOCK):
            offs = k0 + tl.arange(0, BLOCK)
            x = tl.load(x_ptr + row * stride_x + offs, mask=offs < K, other=0.0)
            q = tl.clamp(tl.math.div_rn(x.to(tl.float32), scale), -FP8_MAX_C, FP8_MAX_C)
            tl.store(q_ptr + row * stride_q + offs, q.to(q_ptr.dtype.element_ty), mask=offs < K)


def per_token_quant_fp8_triton(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton path of ``per_token_quant_fp8_ref`` (same contract); x must be 2-D."""
    m, k = x.shape
    q = torch.empty((m, k), dtype=FP8_DTYPE, device=x.device)
    scale = torch.empty((m, 1), dtype=torch.float32, device=x.device)
    block = min(triton.next_power_of_2(k), 4096)
    _per_token_quant_kernel[(m,)](x, q, scale, k, x.stride(0), q.stride(0),
                                  FP8_MAX_C=FP8_MAX, MIN_SCALE=_MIN_SCALE, BLOCK=block,
                                  num_warps=4 if block <= 2048 else 8)
    return q, scale


def per_token_quant_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if x.is_cuda and triton is not None:
        return per_token_quant_fp8_triton(x)
    return per_token_quant_fp8_ref(x)


def fp8_linear_ref(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                   input_scale: torch.Tensor | None = None,
                   bias: torch.Tensor | None = None) -> torch.Tensor:
    """W8A8 emulated in fp32: the activation is quantized exactly as the GPU path does."""
    x2 = x.reshape(-1, x.shape[-1])
    if input_scale is None:
        xq, x_scale = per_token_quant_fp8_ref(x2)
    else:
        x_scale = input_scale.float().reshape(1, 1)
        xq = quantize_fp8(x2, x_scale)
    w = weight.float() * weight_scale.float().reshape(-1, 1)
    out = (xq.float() * x_scale) @ w.t()
    if bias is not None:
        out = out + bias.float()
    return out.to(x.dtype).reshape(*x.shape[:-1], -1)


def fp8_linear_w8a16(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                     bias: torch.Tensor | None = None) -> torch.Tensor:
    """The weight upcast to x's dtype (GPUs without FP8, CPUs)."""
    w = (weight.to(torch.float32) * weight_scale.float().reshape(-1, 1)).to(x.dtype)
    return F.linear(x, w, bias)


def fp8_scaled_mm(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                  input_scale: torch.Tensor | None = None,
                  bias: torch.Tensor | None = None) -> torch.Tensor:
    """W8A8 on an FP8 GPU: per-token (dynamic) or per-tensor (static) activation scales,
    per-channel weight scales, through ``fp8_mm`` on Hopper for ``FP8_MM_ROWS`` rows, else
    ``torch._scaled_mm``. x: [M, K] bf16/fp16."""
    if input_scale is None:
        xq, x_scale = per_token_quant_fp8(x)
    else:
        x_scale = input_scale.float().reshape(1, 1)
        xq = quantize_fp8(x, x_scale)
        x_scale = x_scale.expand(x.shape[0], 1).contiguous()
    if x.shape[0] in FP8_MM_ROWS and triton is not None and cuda_capability(x.device)[0] == 9:
        return fp8_mm_triton(xq, weight, x_scale, weight_scale, x.dtype, bias)
    # Row-wise scaling (scale_a [M, 1], scale_b [1, N]) takes bf16 output only.
    out = torch._scaled_mm(xq, weight.t(), scale_a=x_scale,
                           scale_b=weight_scale.float().reshape(1, -1),
                           out_dtype=torch.bfloat16)
    if bias is not None:
        out = out + bias.to(out.dtype)
    return out.to(x.dtype)


GEMV_DISPATCH_M = 2  # rows fp8_linear sends to it (at M = 4 _scaled_mm was faster on the H200)


def fp8_gemv_triton(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                    config: GemvTiles | None = None) -> torch.Tensor:
    """W8A16 ``x @ (weight * weight_scale).T`` for x [M, K], M <= ``gemv.GEMV_MAX_M``,
    weight float8 [N, K], weight_scale float32 [N] (or one per tensor); out in x's dtype;
    tiles ``gemv.GemvTiles`` (default ``gemv.pick_gemv_tiles``)."""
    return gemv_triton(x, weight, weight_scale, config)


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
               input_scale: torch.Tensor | None = None,
               bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] -> [..., N]: on CUDA the W8A16 GEMV for M <= GEMV_DISPATCH_M (the static
    input scale is then unused: activations stay in x's dtype); W8A8 on an FP8 GPU
    (K, N multiples of 16) above that; else W8A16 through a dequantized weight."""
    n, k = weight.shape
    m = x.numel() // k if k else 0
    if x.is_cuda and triton is not None and 0 < m <= GEMV_DISPATCH_M:
        out = fp8_gemv_triton(x.reshape(m, k), weight, weight_scale)
        if bias is not None:
            out = out + bias.to(out.dtype)
        return out.reshape(*x.shape[:-1], n)
    if fp8_supported(x.device) and k % 16 == 0 and n % 16 == 0:
        x2 = x.reshape(-1, k)
        return fp8_scaled_mm(x2, weight, weight_scale, input_scale, bias).reshape(
            *x.shape[:-1], n)
    return fp8_linear_w8a16(x, weight, weight_scale, bias)
