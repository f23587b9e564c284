"""W4A16 / W8A16 GEMV for one row of x (decode at batch 1) on the layout of
``tamis.kernels.w4a16`` (int32 words packed along K, per-group scales and zero points).

No tensor cores: each program streams a [BLOCK_KW, BLOCK_N] tile of packed words (each
word loaded once, coalesced along N), turns value j of every word into the float
``1 + q / 2**bits`` with one shift and one and/or (the code lands in the top mantissa
bits of 1.0: no int->float conversion), and accumulates ``x_k * (1 + q/2**bits)`` with
one FMA per weight. The group's scale and zero point come in once per word row through
``sum_k x_k (q_k - z) s = s (2**bits * sum_k x_k w_k - (2**bits + z) * sum_k x_k)``.
K is split over programs; the last program of a column block reduces the splits
(``tamis.kernels.splitk``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from tamis.kernels.splitk import even_split, sm_count, split_buffers

try:
    import triton
    import triton.language as tl
    from tamis.kernels.gemv import sum_at_arrival
except ImportError:  # CPU-only installs without triton
    triton = None


@dataclass(frozen=True)
class GemvConfig:
    block_n: int    # output columns per program
    block_kw: int   # packed word rows per loop step (BLOCK_K = block_kw * 32 // bits)
    split_k: int    # programs along K per column block (reduced in the same launch)
    num_warps: int = 4
    num_stages: int = 3


def pick_gemv_config(n: int, k: int, bits: int, num_sms: int = 132) -> GemvConfig:
    """GEMV tiles, the fastest of the sweeps (bench/results/quant.md): 128 columns x 32
    word rows per step with 8 K splits (4 once N alone gives more than one column block
    per SM)."""
    blocks = -(-n // 128)
    return GemvConfig(128, 32, 8 if blocks < num_sms else 4)


def gemv_supported(k: int, group_size: int, bits: int) -> bool:
    """The GEMV handles groups made of whole words (or one group for all of K)."""
    return group_size % (32 // bits) == 0 or group_size >= k


if triton is not None:

    @triton.jit
    def _wna16_gemv_kernel(
        x_ptr, qw_ptr, s_ptr, z_ptr, out_ptr, part_ptr, count_ptr,
        N, K, K_SPLIT, stride_qk, stride_sg,
        GROUP_SIZE: tl.constexpr, BITS: tl.constexpr, ROW_GROUPS: tl.constexpr,
        BLOCK_N: tl.constexpr, BLOCK_KW: tl.constexpr, SPLIT, HAS_SPLIT: tl.constexpr,
    ):
        PACK: tl.constexpr = 32 // BITS
        BLOCK_K: tl.constexpr = BLOCK_KW * PACK
        CODE_BITS: tl.constexpr = ((1 << BITS) - 1) << (23 - BITS)  # top mantissa bits
        ONE: tl.constexpr = 0x3F800000  # 1.0f
        LEVELS: tl.constexpr = 1 << BITS
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        mask_n = offs_n < N
        offs_w = tl.arange(0, BLOCK_KW)
        acc = tl.zeros((BLOCK_KW, BLOCK_N), dtype=tl.float32)
        k_lo = pid_k * K_SPLIT
        k_hi = tl.minimum(k_lo + K_SPLIT, K)
        for k0 in range(k_lo, k_hi, BLOCK_K):
            rows = k0 // PACK + offs_w
            wmask = (rows[:, None] * PACK < k_hi) & mask_n[None, :]
            words = tl.load(qw_ptr + rows[:, None] * stride_qk + offs_n[None, :],
                            mask=wmask, other=0)
            if ROW_GROUPS:  # groups shorter than the tile: one group per word row
                g = (rows * PACK) // GROUP_SIZE
                s = tl.load(s_ptr + g[:, None] * stride_sg + offs_n[None, :], mask=wmask,
                            other=0.0).to(tl.float32)
                z = tl.load(z_ptr + g[:, None] * stride_sg + offs_n[None, :], mask=wmask,
                            other=0.0).to(tl.float32)
            else:  # the whole tile lies in one group
                g = k0 // GROUP_SIZE
                s = tl.load(s_ptr + g * stride_sg + offs_n, mask=mask_n,
                            other=0.0).to(tl.float32)[None, :]
                z = tl.load(z_ptr + g * stride_sg + offs_n, mask=mask_n,
                            other=0.0).to(tl.float32)[None, :]
            products = tl.zeros((BLOCK_KW, BLOCK_N), dtype=tl.float32)
            x_sums = tl.zeros((BLOCK_KW,), dtype=tl.float32)
            for j in tl.static_range(PACK):
                # value j of each word -> the top mantissa bits of 1.0: w = 1 + q / LEVELS
                if 23 - BITS - BITS * j >= 0:
                    v = words << (23 - BITS - BITS * j)
                else:
                    v = words >> (BITS * j + BITS - 23)
                w = ((v & CODE_BITS) | ONE).to(tl.float32, bitcast=True)
                xk = k0 + offs_w * PACK + j
                xj = tl.load(x_ptr + xk, mask=xk < k_hi, other=0.0).to(tl.float32)
                products += w * xj[:, None]
                x_sums += xj
            acc += products * (s * LEVELS) - x_sums[:, None] * ((z + LEVELS) * s)
        col = tl.sum(acc, axis=0)
        if not HAS_SPLIT:
            tl.store(out_ptr + offs_n, col.to(out_ptr.dtype.element_ty), mask=mask_n)
        else:
            tl.store(part_ptr + pid_k * N + offs_n, col, mask=mask_n)
            one_row = tl.full((BLOCK_N,), 1, dtype=tl.int32)
            sum_at_arrival(part_ptr, out_ptr, count_ptr + pid_n, offs_n, mask_n, one_row, N,
                           0, 1.0, SPLIT, 1, BLOCK_N)


def w4a16_gemv_triton(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                      zeros: torch.Tensor, group_size: int, bits: int = 4,
                      config: GemvConfig | None = None) -> torch.Tensor:
    """GEMV path of ``w4a16_gemm_ref`` (same contract) for x [1, K], groups of whole
    words (``gemv_supported``). Scales/zeros must be contiguous in N."""
    if triton is None:
        raise RuntimeError("w4a16_gemv_triton needs triton installed")
    m, k = x.shape
    n = qweight.shape[1]
    if m != 1 or not gemv_supported(k, group_size, bits):
        raise ValueError(f"GEMV path takes one row and whole-word groups; got M={m}, "
                         f"group {group_size}, {bits} bits")
    x = x.contiguous()
    config = config or pick_gemv_config(n, k, bits, sm_count(x))
    block_k = config.block_kw * (32 // bits)
    splits, k_split = even_split(k, block_k, config.split_k)
    blocks = triton.cdiv(n, config.block_n)
    out = torch.empty((1, n), dtype=x.dtype, device=x.device)
    partials, counters = split_buffers(out, splits, (n,), blocks)
    _wna16_gemv_kernel[(blocks, splits)](
        x, qweight, scales, zeros, out, partials, counters,
        n, k, k_split, qweight.stride(0), scales.stride(0),
        GROUP_SIZE=group_size, BITS=bits,
        ROW_GROUPS=not (group_size % block_k == 0 or group_size >= k),
        BLOCK_N=config.block_n, BLOCK_KW=config.block_kw,
        SPLIT=splits, HAS_SPLIT=splits > 1,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )
    return out
