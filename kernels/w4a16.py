"""W4A16 (and W8A16) dequantize-GEMM: ``y = x @ dequant(qweight)``.

One weight layout serves AWQ, GPTQ (act-order included) and compressed-tensors; the
loaders in ``tamis.quant`` repack into it once after loading:

```
qweight  int32 [ceil(K / P), N]   P = 32 // bits values per word, packed along K,
                                  value j of word r is row k = P*r + j at bits [bits*j, bits*(j+1))
                                  (or the interleaved order of ``tamis.kernels.w4a16_common``)
scales   [G, N]  fp16 or fp32     G = ceil(K / group_size); row k uses group k // group_size
zeros    [G, N]  like scales      the zero point as a float (AWQ/GPTQ integers, already
                                  corrected for GPTQ v1's "+1"), so w = (q - zero) * scale
```

Act-order (GPTQ ``desc_act``) is handled outside the kernel: the loader sorts K by
``g_idx`` so groups become contiguous, and the caller permutes x's columns with the
same permutation (``x[..., perm]``).

This module holds the plain-torch reference (``w4a16_gemm_ref``) and the two kernels
that read either word order: ``w4a16_gemm_triton`` (tl.dot on a dequantized
[BLOCK_K, BLOCK_N] tile, tile configs by M bucket, split-K reduced in the same launch
for small M) and ``w4a16_gemm_dequant`` (the dense weight, then cuBLAS). Which kernel
runs for a layer is chosen once, when it is loaded: ``tamis.quant.wna16_kernels``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from tamis.kernels.splitk import sm_count, split_buffers
from tamis.kernels.w4a16_common import code_shifts
from tamis.kernels.wna16_dequant import dequantize_wna16_triton

try:
    import triton
    import triton.language as tl
    from tamis.kernels.w4a16_common import code_shift
except ImportError:  # CPU-only installs without triton still get the reference
    triton = None


def dequantize_wna16(qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                     group_size: int, bits: int, in_features: int,
                     interleaved: bool = False) -> torch.Tensor:
    """The dense weight [K, N] in float32: (q - zero) * scale per group."""
    shifts = torch.tensor(code_shifts(bits, interleaved), dtype=torch.int32,
                          device=qweight.device)
    q = (qweight.unsqueeze(1) >> shifts[None, :, None]) & ((1 << bits) - 1)
    q = q.reshape(-1, qweight.shape[1])[:in_features]
    group = torch.arange(in_features, device=qweight.device) // group_size
    return (q.float() - zeros[group].float()) * scales[group].float()


def w4a16_gemm_ref(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                   zeros: torch.Tensor, group_size: int, bits: int = 4,
                   interleaved: bool = False) -> torch.Tensor:
    """x [M, K] -> [M, N] in x's dtype, through the dequantized weight."""
    weight = dequantize_wna16(qweight, scales, zeros, group_size, bits, x.shape[-1],
                              interleaved)
    return (x.float() @ weight).to(x.dtype)


@dataclass(frozen=True)
class GemmConfig:
    block_m: int
    block_n: int
    block_k: int
    split_k: int
    num_warps: int
    num_stages: int


def _pow2_split(blocks: int, target: int, cap: int) -> int:
    """The smallest power of two s <= cap with blocks * s >= target."""
    split = 1
    while blocks * split < target and split < cap:
        split *= 2
    return split


def pick_config(m: int, n: int, k: int, group_size: int, num_sms: int = 132) -> GemmConfig:
    """tl.dot tiles by M bucket (the fastest of the tile sweeps, bench/results/quant.md).
    Small M has few column tiles, so K is split until there are enough programs: M <= 16
    a 16x64 tile split up to 4 ways, 3 stages (16x128 split up to 8 on wide layers)
    aiming at 4 programs per SM; M <= 64 a 64x64x128 tile split up to 4 ways aiming at 2
    (or, when N alone gives that many, a 64x128x128 tile on 4 warps, which beat 8);
    larger M 128x128 with 8 warps."""
    block_k = 128 if group_size % 128 == 0 else (64 if group_size % 64 == 0 else 32)
    n64 = -(-n // 64)
    if m <= 16:
        if n64 >= 2 * num_sms:   # wide layers: 128-column tiles
            return GemmConfig(16, 128, block_k, _pow2_split(-(-n // 128), 4 * num_sms, 8), 4, 3)
        return GemmConfig(16, 64, block_k, _pow2_split(n64, 4 * num_sms, 4), 4, 3)
    if m <= 64:
        if n64 >= 2 * num_sms:
            return GemmConfig(64, 128, block_k, 1, 4, 3)
        return GemmConfig(64, 64, block_k, _pow2_split(n64, 2 * num_sms, 4), 4, 3)
    blocks = -(-m // 128) * -(-n // 128)
    return GemmConfig(128, 128, min(block_k, 64), 2 if 2 * blocks <= num_sms else 1, 8, 3)


if triton is not None:

    @triton.jit
    def _dot_tile(x, qw_ptr, s_ptr, z_ptr, k0, offs_n, mask_n, K,
                  stride_qk, stride_qn, stride_sg, stride_sn,
                  GROUP_SIZE: tl.constexpr, BITS: tl.constexpr, BLOCK_K: tl.constexpr,
                  GROUPS_ALIGNED: tl.constexpr, INTERLEAVED: tl.constexpr):
        """x [BLOCK_M, BLOCK_K] @ the dequantized [BLOCK_K, BLOCK_N] tile of rows k0.., fp32.
        Each word loads once and unpacks by a reshape."""
        PACK: tl.constexpr = 32 // BITS
        MASK: tl.constexpr = (1 << BITS) - 1
        BLOCK_N: tl.constexpr = offs_n.shape[0]
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask_k = offs_k < K
        rows = k0 // PACK + tl.arange(0, BLOCK_K // PACK)
        words = tl.load(qw_ptr + rows[:, None] * stride_qk + offs_n[None, :] * stride_qn,
                        mask=(rows[:, None] * PACK < K) & mask_n[None, :], other=0)
        shifts = code_shift(tl.arange(0, PACK), BITS, INTERLEAVED)
        q3 = (words[:, None, :] >> shifts[None, :, None]) & MASK
        q = tl.reshape(q3, (BLOCK_K, BLOCK_N))
        if GROUPS_ALIGNED:
            # One group per tile: the scale goes on the dot's result, not every element.
            g = k0 // GROUP_SIZE
            s = tl.load(s_ptr + g * stride_sg + offs_n * stride_sn, mask=mask_n, other=0.0)
            z = tl.load(z_ptr + g * stride_sg + offs_n * stride_sn, mask=mask_n, other=0.0)
            w = (q.to(tl.float32) - z.to(tl.float32)[None, :]).to(x.dtype)
            return tl.dot(x, w) * s.to(tl.float32)[None, :]
        else:
            g = offs_k // GROUP_SIZE
            gmask = mask_k[:, None] & mask_n[None, :]
            s = tl.load(s_ptr + g[:, None] * stride_sg + offs_n[None, :] * stride_sn,
                        mask=gmask, other=0.0)
            z = tl.load(z_ptr + g[:, None] * stride_sg + offs_n[None, :] * stride_sn,
                        mask=gmask, other=0.0)
            w = ((q.to(tl.float32) - z.to(tl.float32)) * s.to(tl.float32)).to(x.dtype)
            return tl.dot(x, w)

    @triton.jit
    def _wna16_gemm_kernel(
        x_ptr, qw_ptr, s_ptr, z_ptr, out_ptr, part_ptr, count_ptr,
        M, N, K,
        stride_xm, stride_xk, stride_qk, stride_qn, stride_sg, stride_sn,
        stride_om, stride_on,
        GROUP_SIZE: tl.constexpr, BITS: tl.constexpr, GROUPS_ALIGNED: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
        SPLIT_K, HAS_SPLIT: tl.constexpr,
        LOOP_STAGES: tl.constexpr, INTERLEAVED: tl.constexpr,
    ):
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        pid_k = tl.program_id(2)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        mask_m = offs_m < M
        mask_n = offs_n < N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in tl.range(pid_k * BLOCK_K, K, BLOCK_K * SPLIT_K, num_stages=LOOP_STAGES):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            mask_k = offs_k < K
            x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk,
                        mask=mask_m[:, None] & mask_k[None, :], other=0.0)
            acc += _dot_tile(x, qw_ptr, s_ptr, z_ptr, k0, offs_n, mask_n, K,
                             stride_qk, stride_qn, stride_sg, stride_sn,
                             GROUP_SIZE, BITS, BLOCK_K, GROUPS_ALIGNED, INTERLEAVED)
        out_ptrs = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :] * stride_on
        out_mask = mask_m[:, None] & mask_n[None, :]
        if not HAS_SPLIT:
            tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=out_mask)
        else:
            # partials [SPLIT_K, M, N] fp32; the last split of this tile reduces them.
            part_ptrs = part_ptr + offs_m[:, None] * N + offs_n[None, :]
            tl.store(part_ptrs + pid_k * M * N, acc, mask=out_mask)
            tl.debug_barrier()
            tile = pid_m * tl.num_programs(1) + pid_n
            done = tl.atomic_add(count_ptr + tile, 1)
            if done == SPLIT_K - 1:
                total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
                for sk in range(SPLIT_K):
                    total += tl.load(part_ptrs + sk * M * N, mask=out_mask, other=0.0,
                                     cache_modifier=".cg")
                tl.store(out_ptrs, total.to(out_ptr.dtype.element_ty), mask=out_mask)
                tl.store(count_ptr + tile, 0)


def w4a16_gemm_triton(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                      zeros: torch.Tensor, group_size: int, bits: int = 4,
                      config: GemmConfig | None = None,
                      interleaved: bool = False) -> torch.Tensor:
    """Triton tl.dot path of ``w4a16_gemm_ref`` (same contract); x must be 2-D."""
    if triton is None:
        raise RuntimeError("w4a16_gemm_triton needs triton installed")
    m, k = x.shape
    n = qweight.shape[1]
    if config is None:
        config = pick_config(m, n, k, group_size, sm_count(x))
    aligned = group_size % config.block_k == 0
    splits = max(1, min(config.split_k, triton.cdiv(k, config.block_k)))
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(m, config.block_m), triton.cdiv(n, config.block_n), splits)
    partials, counters = split_buffers(out, splits, (m, n), grid[0] * grid[1])
    _wna16_gemm_kernel[grid](
        x, qweight, scales, zeros, out, partials, counters, m, n, k,
        x.stride(0), x.stride(1), qweight.stride(0), qweight.stride(1),
        scales.stride(0), scales.stride(1), out.stride(0), out.stride(1),
        GROUP_SIZE=group_size, BITS=bits, GROUPS_ALIGNED=aligned,
        BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
        SPLIT_K=splits, HAS_SPLIT=splits > 1,
        LOOP_STAGES=config.num_stages, INTERLEAVED=interleaved,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )
    return out


def w4a16_gemm_dequant(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                       zeros: torch.Tensor, group_size: int, bits: int = 4,
                       interleaved: bool = False) -> torch.Tensor:
    """Large-M path (same contract as ``w4a16_gemm_ref``, x 2-D on CUDA): the dense
    weight in x's dtype, then a cuBLAS GEMM. Needs K x N x 2 bytes of scratch."""
    weight = dequantize_wna16_triton(qweight, scales, zeros, group_size, bits, x.shape[1],
                                     x.dtype, interleaved)
    return torch.matmul(x, weight)
