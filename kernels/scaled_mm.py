"""The W8A8 matmul both 8-bit checkpoint formats run: ``C = A @ B.T`` on 8-bit codes with
the scales applied either once per output (INT8: int32 accumulation, exact) or per K
group (block FP8: each group's fp32 partial dot times its two scales).

```
per output    a_scale [M]                      b_scale [N]
per K group   a_scale [M, ceil(K/G)]           b_scale [ceil(N/n_group), ceil(K/G)]
              C[m, n] = sum_g a_scale[m, g] * b_scale[n // n_group, g] * (A[m, g] . B[n, g])
```
References: ``kernels/int8.py`` ``int8_scaled_mm_ref`` and ``kernels/fp8_block.py``
``w8a8_block_fp8_matmul_ref``.
"""
from __future__ import annotations

import torch

from tamis.kernels._triton import kernel, triton_available

if triton_available():
    import triton.language as tl


@kernel
def _scaled_mm_kernel(a_ptr, b_ptr, c_ptr, as_ptr, bs_ptr, M, N, K,
                      stride_am, stride_bn, stride_cm, stride_asm, stride_bsn,
                      GROUP_N: tl.constexpr, PER_K_GROUP: tl.constexpr,
                      ACC_DTYPE: tl.constexpr, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """With PER_K_GROUP the K group is BLOCK_K, so each dot gets one scale pair."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m = offs_m < M
    mask_n = offs_n < N
    a_scales = as_ptr + offs_m * stride_asm
    b_scales = bs_ptr + (offs_n // GROUP_N) * stride_bsn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=ACC_DTYPE)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + offs_k
        a = tl.load(a_ptr + offs_m[:, None] * stride_am + ks[None, :],
                    mask=mask_m[:, None] & (ks[None, :] < K), other=0.0)
        b = tl.load(b_ptr + offs_n[None, :] * stride_bn + ks[:, None],
                    mask=mask_n[None, :] & (ks[:, None] < K), other=0.0)
        partial = tl.dot(a, b, out_dtype=ACC_DTYPE)
        if PER_K_GROUP:
            group = k0 // BLOCK_K
            a_s = tl.load(a_scales + group, mask=mask_m, other=0.0)
            b_s = tl.load(b_scales + group, mask=mask_n, other=0.0)
            acc += partial * a_s[:, None] * b_s[None, :]
        else:
            acc += partial
    out = acc.to(tl.float32)
    if not PER_K_GROUP:
        a_s = tl.load(a_scales, mask=mask_m, other=0.0)
        b_s = tl.load(b_scales, mask=mask_n, other=0.0)
        out = out * a_s[:, None] * b_s[None, :]
    tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :],
             out.to(c_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


def _block_m(m: int) -> int:
    """Row tile: small for decode batches (the rest of a 64-row tile would be masked off)."""
    return 16 if m <= 16 else (32 if m <= 32 else 64)


def scaled_mm_triton(a: torch.Tensor, b: torch.Tensor, a_scale: torch.Tensor,
                     b_scale: torch.Tensor, out_dtype: torch.dtype, *,
                     k_group: int | None = None, n_group: int = 1,
                     block_n: int = 128, block_k: int = 64) -> torch.Tensor:
    """a [M, K], b [N, K] 8-bit codes (or the same codes in fp16/fp32, which the
    interpreter's tl.dot also runs); scales as in the module table: per output when
    ``k_group`` is None (int8 codes accumulate in int32), else per K group of ``k_group``
    (the K tile) and N group of ``n_group`` rows. Returns [M, N] in ``out_dtype``."""
    m, k = a.shape
    n = b.shape[0]
    a, b = a.contiguous(), b.contiguous()
    a_scale = a_scale.float().reshape(m, -1).contiguous()
    b_scale = b_scale.float().reshape(-(-n // n_group), -1).contiguous()
    out = torch.empty((m, n), dtype=out_dtype, device=a.device)
    integer = not a.dtype.is_floating_point
    tile_m = _block_m(m)
    grid = (-(-m // tile_m), -(-n // block_n))
    _scaled_mm_kernel[grid](a, b, out, a_scale, b_scale, m, n, k,
                            a.stride(0), b.stride(0), out.stride(0),
                            a_scale.stride(0), b_scale.stride(0),
                            GROUP_N=n_group, PER_K_GROUP=k_group is not None,
                            ACC_DTYPE=tl.int32 if integer else tl.float32,
                            BLOCK_M=tile_m, BLOCK_N=block_n, BLOCK_K=k_group or block_k)
    return out
