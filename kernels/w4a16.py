"""W4A16 (and W8A16) dequantize-GEMM: ``y = x @ dequant(qweight)``.

One weight layout serves AWQ, GPTQ (act-order included) and compressed-tensors; the
loaders in ``tamis.quant`` repack into it once after loading:

```
qweight  int32 [ceil(K / P), N]   P = 32 // bits values per word, packed along K,
                                  value j of word r is row k = P*r + j at bits [bits*j, bits*(j+1))
scales   [G, N]  fp16 or fp32     G = ceil(K / group_size); row k uses group k // group_size
zeros    [G, N]  like scales      the zero point as a float (AWQ/GPTQ integers, already
                                  corrected for GPTQ v1's "+1"), so w = (q - zero) * scale
```

Act-order (GPTQ ``desc_act``) is handled outside the kernel: the loader sorts K by
``g_idx`` so groups become contiguous, and the caller permutes x's columns with the
same permutation (``x[..., perm]``).

``w4a16_gemm_ref`` is the plain-torch reference; ``w4a16_gemm_triton`` dequantizes in
registers (one tile of int32 words -> a [BLOCK_K, BLOCK_N] fp tile per step) with one
tuning for decode (M <= 16: small BLOCK_M, split-K so every SM has work) and one for
prefill; ``w4a16_gemm`` dispatches (Triton on CUDA, reference elsewhere).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs without triton still get the reference
    triton = None


def dequantize_wna16(qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                     group_size: int, bits: int, in_features: int) -> torch.Tensor:
    """The dense weight [K, N] in float32: (q - zero) * scale per group."""
    factor = 32 // bits
    shifts = torch.arange(factor, dtype=torch.int32, device=qweight.device) * bits
    q = (qweight.unsqueeze(1) >> shifts[None, :, None]) & ((1 << bits) - 1)
    q = q.reshape(-1, qweight.shape[1])[:in_features]
    group = torch.arange(in_features, device=qweight.device) // group_size
    return (q.float() - zeros[group].float()) * scales[group].float()


def w4a16_gemm_ref(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                   zeros: torch.Tensor, group_size: int, bits: int = 4) -> torch.Tensor:
    """x [M, K] -> [M, N] in x's dtype, through the dequantized weight."""
    weight = dequantize_wna16(qweight, scales, zeros, group_size, bits, x.shape[-1])
    return (x.float() @ weight).to(x.dtype)


@dataclass(frozen=True)
class GemmConfig:
    block_m: int
    block_n: int
    block_k: int
    split_k: int
    num_warps: int
    num_stages: int


def pick_config(m: int, n: int, k: int, group_size: int, num_sms: int = 132) -> GemmConfig:
    """Tile choice by M bucket, from the H200 sweep in bench/results/quant.md: decode
    (M <= 16) likes thin 32-column tiles with BLOCK_K 128 and split-K only for long K;
    M <= 64 a 32x64 tile; prefill 128x128 with 8 warps."""
    block_k = 128 if group_size % 128 == 0 else (64 if group_size % 64 == 0 else 32)
    if m <= 16:
        split_k = 2 if k >= 8192 else 1
        return GemmConfig(16, 32, block_k, split_k, num_warps=4, num_stages=4)
    if m <= 64:
        return GemmConfig(32, 64, min(block_k, 64), 1, num_warps=4, num_stages=4)
    return GemmConfig(128, 128, min(block_k, 64), 1, num_warps=8, num_stages=3)


if triton is not None:

    @triton.jit
    def _wna16_gemm_kernel(
        x_ptr, qw_ptr, s_ptr, z_ptr, out_ptr,
        M, N, K,
        stride_xm, stride_xk, stride_qk, stride_qn, stride_sg, stride_sn,
        stride_om, stride_on,
        GROUP_SIZE: tl.constexpr, BITS: tl.constexpr, GROUPS_ALIGNED: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
        SPLIT_K: tl.constexpr,
    ):
        PACK: tl.constexpr = 32 // BITS
        MASK: tl.constexpr = (1 << BITS) - 1
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        pid_k = tl.program_id(2)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        mask_m = offs_m < M
        mask_n = offs_n < N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(pid_k * BLOCK_K, K, BLOCK_K * SPLIT_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            mask_k = offs_k < K
            x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk,
                        mask=mask_m[:, None] & mask_k[None, :], other=0.0)
            words = tl.load(qw_ptr + (offs_k[:, None] // PACK) * stride_qk
                            + offs_n[None, :] * stride_qn,
                            mask=mask_k[:, None] & mask_n[None, :], other=0)
            q = (words >> ((offs_k[:, None] % PACK) * BITS)) & MASK
            if GROUPS_ALIGNED:
                # One group per tile: apply the scale to the dot's result, not to every element.
                g = k0 // GROUP_SIZE
                s = tl.load(s_ptr + g * stride_sg + offs_n * stride_sn, mask=mask_n, other=0.0)
                z = tl.load(z_ptr + g * stride_sg + offs_n * stride_sn, mask=mask_n, other=0.0)
                w = (q.to(tl.float32) - z.to(tl.float32)[None, :]).to(x.dtype)
                acc += tl.dot(x, w) * s.to(tl.float32)[None, :]
            else:
                g = offs_k // GROUP_SIZE
                gmask = mask_k[:, None] & mask_n[None, :]
                s = tl.load(s_ptr + g[:, None] * stride_sg + offs_n[None, :] * stride_sn,
                            mask=gmask, other=0.0)
                z = tl.load(z_ptr + g[:, None] * stride_sg + offs_n[None, :] * stride_sn,
                            mask=gmask, other=0.0)
                w = ((q.to(tl.float32) - z.to(tl.float32)) * s.to(tl.float32)).to(x.dtype)
                acc += tl.dot(x, w)
        out_ptrs = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :] * stride_on
        out_mask = mask_m[:, None] & mask_n[None, :]
        if SPLIT_K == 1:
            tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=out_mask)
        else:
            tl.atomic_add(out_ptrs, acc, mask=out_mask)


def w4a16_gemm_triton(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                      zeros: torch.Tensor, group_size: int, bits: int = 4,
                      config: GemmConfig | None = None) -> torch.Tensor:
    """Triton path of ``w4a16_gemm_ref`` (same contract); x must be 2-D."""
    if triton is None:
        raise RuntimeError("w4a16_gemm_triton needs triton installed")
    m, k = x.shape
    n = qweight.shape[1]
    if config is None:
        num_sms = (torch.cuda.get_device_properties(x.device).multi_processor_count
                   if x.is_cuda else 4)
        config = pick_config(m, n, k, group_size, num_sms)
    aligned = group_size % config.block_k == 0
    if config.split_k > 1:
        out = torch.zeros((m, n), dtype=torch.float32, device=x.device)
    else:
        out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(m, config.block_m), triton.cdiv(n, config.block_n), config.split_k)
    _wna16_gemm_kernel[grid](
        x, qweight, scales, zeros, out, m, n, k,
        x.stride(0), x.stride(1), qweight.stride(0), qweight.stride(1),
        scales.stride(0), scales.stride(1), out.stride(0), out.stride(1),
        GROUP_SIZE=group_size, BITS=bits, GROUPS_ALIGNED=aligned,
        BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
        SPLIT_K=config.split_k, num_warps=config.num_warps, num_stages=config.num_stages,
    )
    return out.to(x.dtype) if config.split_k > 1 else out


def w4a16_gemm(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
               zeros: torch.Tensor, group_size: int, bits: int = 4) -> torch.Tensor:
    """x [..., K] -> [..., N]: Triton on CUDA, the reference elsewhere."""
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    if x2.is_cuda and triton is not None:
        out = w4a16_gemm_triton(x2, qweight, scales, zeros, group_size, bits)
    else:
        out = w4a16_gemm_ref(x2, qweight, scales, zeros, group_size, bits)
    return out.reshape(*lead, out.shape[-1])
