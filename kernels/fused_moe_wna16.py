"""The fused-MoE grouped GEMM over integer experts (W4A16 / W8A16, ``WNA16Experts``).

The same sorted-block GEMM as ``tamis.kernels.fused_moe``'s, but each ``[BLOCK_K, BLOCK_N]``
weight tile is read as packed int32 words and dequantized in registers, as vLLM's
``use_int4_w4a16`` path does: the expert weights stay 4 (or 8) bits in memory::

    word  = qweight[e, k // P, n]                  P = 32 // bits
    q     = (word >> (bits * (k % P))) & (2**bits - 1)
    w     = (q - zeros[e, g, n]) * scales[e, g, n]  g = k // group_size, or g_idx[e, k]

When a K tile lies inside one group (``BLOCK_K`` divides the group size, or one group
spans K) the scales and zeros are one ``[BLOCK_N]`` row per tile; otherwise (act-order
``g_idx``, or groups smaller than the tile) they are gathered per row.
"""
from __future__ import annotations

import dataclasses

import torch

from tamis.kernels._triton import kernel
from tamis.kernels.moe_align import ExpertBlocks
from tamis.kernels.moe_tiles import moe_block_rows, moe_tile
from tamis.kernels.moe_weights import WNA16Experts

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = tl = None


if tl is not None:
    @kernel
    def _moe_wna16_kernel(a_ptr, qweight_ptr, scales_ptr, zeros_ptr, g_idx_ptr, c_ptr,
                          weights_ptr, sorted_ids_ptr, expert_ids_ptr, num_padded_ptr,
                          N, K, num_pairs, num_blocks_m, stride_am, stride_qe, stride_qk,
                          stride_se, stride_sg, stride_ge, stride_cm,
                          GROUP_SIZE: tl.constexpr, BITS: tl.constexpr,
                          HAS_G_IDX: tl.constexpr, TILE_IN_ONE_GROUP: tl.constexpr,
                          A_ROWS_PER_PAIR: tl.constexpr, MUL_WEIGHT: tl.constexpr,
                          DOT_PRECISION: tl.constexpr, BLOCK_M: tl.constexpr,
                          BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
        pid_m, pid_n = moe_tile(tl.program_id(0), N, num_blocks_m, BLOCK_N, GROUP_M)
        if pid_m * BLOCK_M >= tl.load(num_padded_ptr):
            return
        pair, valid, expert, a_rows = moe_block_rows(sorted_ids_ptr, expert_ids_ptr, pid_m,
                                                     num_pairs, A_ROWS_PER_PAIR, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = offs_n < N
        offs_k = tl.arange(0, BLOCK_K)
        per_word: tl.constexpr = 32 // BITS
        mask: tl.constexpr = (1 << BITS) - 1
        qweight_base = qweight_ptr + expert * stride_qe + offs_n[None, :]
        scale_base = scales_ptr + expert * stride_se + offs_n
        zero_base = zeros_ptr + expert * stride_se + offs_n
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k = k0 + offs_k
            k_ok = k < K
            a = tl.load(a_ptr + a_rows[:, None] * stride_am + k[None, :],
                        mask=valid[:, None] & k_ok[None, :], other=0.0)
            tile_ok = k_ok[:, None] & n_ok[None, :]
            words = tl.load(qweight_base + (k // per_word)[:, None] * stride_qk,
                            mask=tile_ok, other=0)
            codes = (words >> ((k % per_word) * BITS)[:, None]) & mask
            if TILE_IN_ONE_GROUP:
                group = k0 // GROUP_SIZE
                scale = tl.load(scale_base + group * stride_sg, mask=n_ok, other=0.0)[None, :]
                zero = tl.load(zero_base + group * stride_sg, mask=n_ok, other=0.0)[None, :]
            else:
                if HAS_G_IDX:
                    group = tl.load(g_idx_ptr + expert * stride_ge + k, mask=k_ok, other=0)
                else:
                    group = k // GROUP_SIZE
                offsets = group.to(tl.int64)[:, None] * stride_sg
                scale = tl.load(scale_base[None, :] + offsets, mask=tile_ok, other=0.0)
                zero = tl.load(zero_base[None, :] + offsets, mask=tile_ok, other=0.0)
            w = (codes.to(tl.float32) - zero.to(tl.float32)) * scale.to(tl.float32)
            acc = tl.dot(a, w.to(a.dtype), acc, input_precision=DOT_PRECISION)
        if MUL_WEIGHT:
            acc = acc * tl.load(weights_ptr + pair, mask=valid, other=0.0)[:, None]
        c_ptrs = c_ptr + pair.to(tl.int64)[:, None] * stride_cm + offs_n[None, :]
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=valid[:, None] & n_ok[None, :])


def wna16_tiles(tiles, w: WNA16Experts):
    """``tiles`` with ``block_k`` cut to the group size, so that a K tile lies inside one
    group (one row of scales per tile) whenever the groups allow it."""
    per_word = 32 // w.bits
    block_k = tiles.block_k
    if w.g_idx is None and w.group_size < w.in_features:
        block_k = min(block_k, max(w.group_size, 16))
    block_k = max(block_k, per_word)
    return dataclasses.replace(tiles, block_k=block_k)


def grouped_gemm_wna16(a: torch.Tensor, w: WNA16Experts, out: torch.Tensor,
                       blocks: ExpertBlocks, a_rows_per_pair: int,
                       weights: torch.Tensor | None, tiles) -> None:
    """out[pair] = a[pair // a_rows_per_pair] @ dequant(w[expert(pair)]).T (times
    weights[pair]); ``tiles`` as ``tamis.kernels.fused_moe.MoeTiles``."""
    _, n, k = w.shape
    tiles = wna16_tiles(tiles, w)
    one_group = w.g_idx is None and (w.group_size >= k or w.group_size % tiles.block_k == 0)
    num_blocks_m = blocks.sorted_ids.numel() // tiles.block_m
    grid = (num_blocks_m * triton.cdiv(n, tiles.block_n),)
    g_idx = w.g_idx if w.g_idx is not None else blocks.sorted_ids
    _moe_wna16_kernel[grid](
        a, w.qweight, w.scales, w.zeros, g_idx, out, weights if weights is not None else out,
        blocks.sorted_ids, blocks.expert_ids, blocks.num_padded, n, k, blocks.num_pairs,
        num_blocks_m, a.stride(0), w.qweight.stride(0), w.qweight.stride(1),
        w.scales.stride(0), w.scales.stride(1), g_idx.stride(0), out.stride(0),
        GROUP_SIZE=w.group_size, BITS=w.bits, HAS_G_IDX=w.g_idx is not None,
        TILE_IN_ONE_GROUP=one_group, A_ROWS_PER_PAIR=a_rows_per_pair,
        MUL_WEIGHT=weights is not None,
        DOT_PRECISION="ieee" if a.dtype == torch.float32 else "tf32",
        BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k,
        GROUP_M=tiles.group_m, num_warps=tiles.num_warps, num_stages=tiles.num_stages)
