"""The fused-MoE grouped GEMM over block-wise FP8 experts (``Fp8BlockExperts``).

The same sorted-block GEMM as ``tamis.kernels.fused_moe``'s, with the weight's 128x128
block scales applied inside the K loop, as vLLM's ``fused_moe`` does with
``block_shape``. A K tile never straddles two K groups (``BLOCK_K`` divides the group),
so each tile's partial dot gets one scale per output column::

    W8A8   a = FP8 codes of the activations, a_scale [rows of a, ceil(K/bk)] (one per
           token and K group, ``per_token_group_quant_fp8``)
           acc += (a . w) * a_scale[row, g] * scale_inv[e, block_row(n), g]
    W8A16  a = the activations (no FP8 tensor cores, or the CPU interpreter)
           acc += (a . w) * scale_inv[e, block_row(n), g]

``block_row(n)`` is the scale row of output row n within its shard (gate or up of w13),
so a shard that is not whole blocks (I % 128 != 0) ends in a partial block of its own.
"""
from __future__ import annotations

import dataclasses

import torch

from tamis.kernels._triton import kernel
from tamis.kernels.moe_align import ExpertBlocks
from tamis.kernels.moe_tiles import moe_block_rows, moe_tile
from tamis.kernels.moe_weights import Fp8BlockExperts

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = tl = None


if tl is not None:
    @kernel
    def _moe_fp8_block_kernel(a_ptr, w_ptr, c_ptr, weights_ptr, w_scale_ptr, a_scale_ptr,
                              sorted_ids_ptr, expert_ids_ptr, num_padded_ptr,
                              N, K, num_pairs, num_blocks_m, shard_rows,
                              stride_am, stride_we, stride_wn, stride_cm,
                              stride_se, stride_sn, stride_asm,
                              GROUP_N: tl.constexpr, GROUP_K: tl.constexpr,
                              HAS_A_SCALE: tl.constexpr, A_ROWS_PER_PAIR: tl.constexpr,
                              MUL_WEIGHT: tl.constexpr, DOT_PRECISION: tl.constexpr,
                              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                              BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
        pid_m, pid_n = moe_tile(tl.program_id(0), N, num_blocks_m, BLOCK_N, GROUP_M)
        if pid_m * BLOCK_M >= tl.load(num_padded_ptr):
            return
        pair, valid, expert, a_rows = moe_block_rows(sorted_ids_ptr, expert_ids_ptr, pid_m,
                                                     num_pairs, A_ROWS_PER_PAIR, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = offs_n < N
        offs_k = tl.arange(0, BLOCK_K)
        a_ptrs = a_ptr + a_rows[:, None] * stride_am + offs_k[None, :]
        w_ptrs = w_ptr + expert * stride_we + offs_n[None, :].to(tl.int64) * stride_wn + \
            offs_k[:, None]
        blocks_per_shard = tl.cdiv(shard_rows, GROUP_N)
        scale_row = (offs_n // shard_rows) * blocks_per_shard + (offs_n % shard_rows) // GROUP_N
        w_scale_ptrs = w_scale_ptr + expert * stride_se + scale_row * stride_sn
        a_scale_ptrs = a_scale_ptr + a_rows * stride_asm
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k_left = offs_k < K - k0
            a = tl.load(a_ptrs, mask=valid[:, None] & k_left[None, :], other=0.0)
            w = tl.load(w_ptrs, mask=k_left[:, None] & n_ok[None, :], other=0.0)
            partial = tl.dot(a, w.to(a.dtype), input_precision=DOT_PRECISION)
            group = k0 // GROUP_K
            partial = partial * tl.load(w_scale_ptrs + group, mask=n_ok, other=0.0)[None, :]
            if HAS_A_SCALE:
                partial = partial * tl.load(a_scale_ptrs + group, mask=valid, other=0.0)[:, None]
            acc += partial
            a_ptrs += BLOCK_K
            w_ptrs += BLOCK_K
        if MUL_WEIGHT:
            acc = acc * tl.load(weights_ptr + pair, mask=valid, other=0.0)[:, None]
        c_ptrs = c_ptr + pair.to(tl.int64)[:, None] * stride_cm + offs_n[None, :]
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=valid[:, None] & n_ok[None, :])


def fp8_block_tiles(tiles, w: Fp8BlockExperts):
    """``tiles`` with ``block_k`` cut to the K group, so a K tile lies inside one group."""
    group_k = w.block[1]
    block_k = min(tiles.block_k, group_k)
    assert group_k % block_k == 0, (group_k, block_k)
    return dataclasses.replace(tiles, block_k=block_k)


def grouped_gemm_fp8_block(a: torch.Tensor, w: Fp8BlockExperts, out: torch.Tensor,
                           blocks: ExpertBlocks, a_rows_per_pair: int,
                           weights: torch.Tensor | None, tiles,
                           a_scale: torch.Tensor | None = None) -> None:
    """out[pair] = a[pair // a_rows_per_pair] @ w[expert(pair)].T with block scales (times
    weights[pair]); ``a_scale`` float32 [rows of a, ceil(K/bk)] when a holds FP8 codes
    (W8A8); ``tiles`` as ``tamis.kernels.fused_moe.MoeTiles``."""
    _, n, k = w.shape
    tiles = fp8_block_tiles(tiles, w)
    num_blocks_m = blocks.sorted_ids.numel() // tiles.block_m
    grid = (num_blocks_m * triton.cdiv(n, tiles.block_n),)
    weight, scale_inv = w.weight, w.scale_inv
    assert weight.stride(2) == 1 and scale_inv.stride(2) == 1 and a.stride(1) == 1
    assert a_scale is None or a_scale.stride(1) == 1
    _moe_fp8_block_kernel[grid](
        a, weight, out, weights if weights is not None else out, scale_inv,
        a_scale if a_scale is not None else out, blocks.sorted_ids, blocks.expert_ids,
        blocks.num_padded, n, k, blocks.num_pairs, num_blocks_m, w.shard_rows,
        a.stride(0), weight.stride(0), weight.stride(1), out.stride(0),
        scale_inv.stride(0), scale_inv.stride(1),
        a_scale.stride(0) if a_scale is not None else 0,
        GROUP_N=w.block[0], GROUP_K=w.block[1], HAS_A_SCALE=a_scale is not None,
        A_ROWS_PER_PAIR=a_rows_per_pair, MUL_WEIGHT=weights is not None,
        DOT_PRECISION="ieee" if a.dtype == torch.float32 else "tf32",
        BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k,
        GROUP_M=tiles.group_m, num_warps=tiles.num_warps, num_stages=tiles.num_stages)
