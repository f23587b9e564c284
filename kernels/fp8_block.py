"""Block-wise FP8 (DeepSeek-V3 / Qwen3-FP8 layout): activation quantization per token
group and the block-scaled W8A8 matmul.

```
weight            float8_e4m3fn [N, K]
weight_scale_inv  float32 [ceil(N/bn), ceil(K/bk)]   w[n, k] = weight[n, k] * s[n//bn, k//bk]
x                 [M, K] -> x_q float8 [M, K], x_scale float32 [M, ceil(K/bk)]
                  x[m, k] = x_q[m, k] * x_scale[m, k//bk]   (one scale per row and K group)
y[m, n] = sum over K groups g of x_scale[m, g] * s[n//bn, g] * (x_q[m, g] . weight[n, g])
```
The scales multiply each group's partial dot product, so the FP8 dot runs on raw codes and
accumulates in fp32, as DeepSeek's and vLLM's ``w8a8_block_fp8_matmul`` do.

- ``per_token_group_quant_fp8`` (Triton on CUDA, ``_ref`` otherwise):
  ``scale = max(amax(group), 1e-10) / 448``, ``x_q = clamp(x / scale)`` (vLLM's and
  DeepSeek's act_quant).
- ``w8a8_block_fp8_matmul_ref`` computes the formula above in fp32; the Triton kernel
  (``w8a8_block_fp8_matmul_triton``, over ``kernels/scaled_mm.py``) must match it within
  fp32 summation order.
- ``dequantize_block_fp8``: the weight in a dense dtype (W8A16), which is what
  transformers runs on a CPU and what tamis's CPU path runs too.
- ``block_fp8_linear`` dispatches: W8A8 through the Triton kernel on a CUDA GPU with FP8
  (compute capability >= 8.9), else the dequantized weight through ``F.linear``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from tamis.kernels._triton import kernel, triton_available, use_triton
from tamis.kernels.fp8 import FP8_DTYPE, FP8_MAX, fp8_supported
from tamis.kernels.scaled_mm import scaled_mm_triton

if triton_available():
    import triton.language as tl
    from tamis.kernels.e4m3 import e4m3_code

GROUP_EPS = 1e-10  # amax floor: an all-zero group gets a tiny scale, not a division by zero


def _pad_to_groups(x: torch.Tensor, group: int) -> torch.Tensor:
    """[..., K] -> [..., G, group] with zeros past K (zeros do not move an amax)."""
    k = x.shape[-1]
    padded = F.pad(x, (0, -k % group))
    return padded.unflatten(-1, (-1, group))


def per_token_group_quant_fp8_ref(x: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (float8 [M, K], float32 scales [M, ceil(K/group)])."""
    grouped = _pad_to_groups(x.float(), group)
    amax = grouped.abs().amax(dim=-1, keepdim=True).clamp(min=GROUP_EPS)
    # over a tensor: torch on CUDA divides by a Python scalar as a product with its
    # reciprocal, one ulp off the IEEE quotient the Triton kernel and the CPU compute
    scale = amax / torch.full_like(amax, FP8_MAX)
    q = (grouped / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q.flatten(-2)[..., :x.shape[-1]], scale.squeeze(-1)


@kernel
def _group_quant_fp8_kernel(x_ptr, q_ptr, s_ptr, K, stride_x, stride_q, stride_s,
                            FP8_MAX_C: tl.constexpr, EPS: tl.constexpr, GROUP: tl.constexpr,
                            ENCODE: tl.constexpr):
    """One program per (row, K group): the group's scale and its codes. ENCODE: ``q_ptr``
    holds bytes (a uint8 view of the float8 codes), written by ``e4m3_code`` as torch's
    cast rounds; else the clamped quotients themselves."""
    row = tl.program_id(0)
    group = tl.program_id(1)
    offs = group * GROUP + tl.arange(0, GROUP)
    mask = offs < K
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    # div_rn: IEEE division as torch does it (Triton's "/" on fp32 is approximate).
    scale = tl.math.div_rn(tl.maximum(tl.max(tl.abs(x), axis=0), EPS), FP8_MAX_C)
    q = tl.clamp(tl.math.div_rn(x, scale), -FP8_MAX_C, FP8_MAX_C)
    if ENCODE:
        q = e4m3_code(q)
    tl.store(q_ptr + row * stride_q + offs, q.to(q_ptr.dtype.element_ty), mask=mask)
    tl.store(s_ptr + row * stride_s + group, scale)


def per_token_group_quant_fp8_triton(x: torch.Tensor, group: int,
                                     codes_dtype: torch.dtype = FP8_DTYPE
                                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton path of ``per_token_group_quant_fp8_ref`` (same contract, the same codes bit
    for bit; group a power of 2). ``codes_dtype=torch.float32`` returns the clamped
    ``x / scale`` before the float8 rounding."""
    m, k = x.shape
    groups = -(-k // group)
    q = torch.empty((m, k), dtype=codes_dtype, device=x.device)
    scale = torch.empty((m, groups), dtype=torch.float32, device=x.device)
    encode = codes_dtype == FP8_DTYPE
    _group_quant_fp8_kernel[(m, groups)](x, q.view(torch.uint8) if encode else q, scale, k,
                                         x.stride(0), q.stride(0), scale.stride(0),
                                         FP8_MAX_C=FP8_MAX, EPS=GROUP_EPS, GROUP=group,
                                         ENCODE=encode)
    return q, scale


def per_token_group_quant_fp8(x: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    if use_triton(x):
        return per_token_group_quant_fp8_triton(x, group)
    return per_token_group_quant_fp8_ref(x, group)


def expand_block_scales(scale_inv: torch.Tensor, shape: tuple[int, int],
                        block: tuple[int, int]) -> torch.Tensor:
    """[ceil(N/bn), ceil(K/bk)] -> [N, K]: each element's block scale (partial edge blocks cut)."""
    n, k = shape
    return (scale_inv.float().repeat_interleave(block[0], dim=0)[:n]
            .repeat_interleave(block[1], dim=1)[:, :k])


def dequantize_block_fp8(weight: torch.Tensor, scale_inv: torch.Tensor,
                         block: tuple[int, int], dtype: torch.dtype) -> torch.Tensor:
    """The dense [N, K] weight ``weight * scale_inv`` per block, computed in fp32, in ``dtype``."""
    return (weight.float() * expand_block_scales(scale_inv, weight.shape, block)).to(dtype)


def w8a8_block_fp8_matmul_ref(x_q: torch.Tensor, x_scale: torch.Tensor, weight: torch.Tensor,
                              scale_inv: torch.Tensor, block: tuple[int, int],
                              out_dtype: torch.dtype) -> torch.Tensor:
    """The module formula in fp32: per K group, dot of codes times both scales."""
    bn, bk = block
    codes_x = _pad_to_groups(x_q.float(), bk)                     # [M, G, bk]
    codes_w = _pad_to_groups(weight.float(), bk)                  # [N, G, bk]
    partial = torch.einsum("mgk,ngk->mng", codes_x, codes_w)      # [M, N, G]
    w_scale = scale_inv.float().repeat_interleave(bn, dim=0)[:weight.shape[0]]   # [N, G]
    out = (partial * x_scale.float()[:, None, :] * w_scale[None, :, :]).sum(-1)
    return out.to(out_dtype)


def w8a8_block_fp8_matmul_triton(x_q: torch.Tensor, x_scale: torch.Tensor,
                                 weight: torch.Tensor, scale_inv: torch.Tensor,
                                 block: tuple[int, int], out_dtype: torch.dtype,
                                 block_n: int = 128) -> torch.Tensor:
    """Triton path of ``w8a8_block_fp8_matmul_ref`` (same contract). x_q and weight may
    also hold the codes in fp32/fp16 (exact for e4m3 values): the interpreter's tl.dot is
    checked on those as well as on float8."""
    return scaled_mm_triton(x_q, weight, x_scale, scale_inv, out_dtype, k_group=block[1],
                            n_group=block[0], block_n=block_n)


def block_fp8_linear(x: torch.Tensor, weight: torch.Tensor, scale_inv: torch.Tensor,
                     block: tuple[int, int], bias: torch.Tensor | None = None,
                     dense: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] -> [..., N]. W8A8 (per-token-group activations) on an FP8 GPU; elsewhere
    ``dense`` (the dequantized weight in x's dtype, computed here when not given)."""
    n, k = weight.shape
    if use_triton(x) and x.numel() and fp8_supported(x.device):
        x2 = x.reshape(-1, k)
        x_q, x_scale = per_token_group_quant_fp8(x2, block[1])
        out = w8a8_block_fp8_matmul_triton(x_q, x_scale, weight, scale_inv, block, x.dtype)
        if bias is not None:
            out = out + bias.to(out.dtype)
        return out.reshape(*x.shape[:-1], n)
    if dense is None:
        dense = dequantize_block_fp8(weight, scale_inv, block, x.dtype)
    return F.linear(x, dense, bias)
