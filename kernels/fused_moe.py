"""Mixture-of-experts MLP over routed tokens: the experts' gated MLPs, weighted and summed.

    x             [M, H]        the tokens
    w13           [E, 2I, H]    per expert: gate rows (silu'd), then up rows
    w2            [E, H, I]     per expert: down projection
                                (plain tensors, or quantized: ``tamis.kernels.moe_weights``)
    topk_weights  [M, k] float  each token's routing weights (already renormalised)
    topk_ids      [M, k] int    each token's experts, in [0, E)
    out           [M, H]        sum_j topk_weights[m, j] * expert_{topk_ids[m, j]}(x[m])

The reference runs each chosen expert's rows through plain torch matmuls (quantized
experts dequantized one at a time; INT8 experts W8A8, their activations quantized per
token as the kernel does). The Triton
path sorts the (token, expert) pairs by expert in blocks (``tamis.kernels.moe_align``)
and runs two grouped GEMMs, each block of rows against its expert's weight: x by w13
(rows gathered from x by ``pair // k``), SiLU-and-mul, then by w2 with the routing
weight applied to the float32 accumulator; the k rows of each token are summed last.
Block FP8 experts run their own grouped GEMM (``tamis.kernels.fused_moe_fp8_block``:
scales inside the K loop), integer W4A16 ones theirs (``tamis.kernels.fused_moe_wna16``).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tamis.kernels._triton import kernel, use_triton
from tamis.kernels.activation import silu_and_mul_ref, silu_and_mul_triton
from tamis.kernels.moe_align import ExpertBlocks, align_by_expert
from tamis.kernels.moe_tiles import moe_block_rows, moe_tile
from tamis.kernels.moe_weights import (ExpertWeights, Fp8BlockExperts, Fp8Experts, Int8Experts,
                                       WNA16Experts, dense_expert, expert_shape)

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = tl = None


def _check(x, w13, w2, topk_weights, topk_ids) -> None:
    w13_shape, w2_shape = expert_shape(w13), expert_shape(w2)
    if x.dim() != 2 or len(w13_shape) != 3 or len(w2_shape) != 3:
        raise ValueError(f"fused_experts expects x [M, H], w13 [E, 2I, H], w2 [E, H, I]; got "
                         f"{tuple(x.shape)}, {w13_shape}, {w2_shape}")
    if type(w13) is not type(w2):
        raise ValueError(f"w13 and w2 must have one form, got {type(w13).__name__} and "
                         f"{type(w2).__name__}")
    experts, two_i, hidden = w13_shape
    if two_i % 2 or hidden != x.shape[1] or w2_shape != (experts, hidden, two_i // 2):
        raise ValueError(f"expert weights do not fit x [M, {x.shape[1]}]: w13 "
                         f"{w13_shape}, w2 {w2_shape} (want [E, 2I, H], [E, H, I])")
    if (topk_ids.shape != topk_weights.shape or topk_ids.dim() != 2
            or topk_ids.shape[0] != x.shape[0]):
        raise ValueError(f"topk_ids {tuple(topk_ids.shape)} and topk_weights "
                         f"{tuple(topk_weights.shape)} must both be [M={x.shape[0]}, top_k]")


def _expert_linear(a: torch.Tensor, w: ExpertWeights, expert: int) -> torch.Tensor:
    """a [T, K] @ expert ``expert``'s weight.T in a's dtype: W8A8 for INT8 experts (per-token
    int8 activations, exact integer dot), else the dequantized weight in a's dtype."""
    if isinstance(w, Int8Experts):
        from tamis.kernels.int8 import int8_scaled_mm_ref, per_token_quant_int8_ref
        codes, scale = per_token_quant_int8_ref(a)
        return int8_scaled_mm_ref(codes, scale, w.weight[expert], w.scale[expert], a.dtype)
    return F.linear(a, dense_expert(w, expert, a.dtype))


def fused_experts_ref(x: torch.Tensor, w13: ExpertWeights, w2: ExpertWeights,
                      topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
    """Expert by expert (in expert order), weighted outputs summed in float32; quantized
    experts are dequantized one at a time into x's dtype (FP8: W8A16), INT8 experts run
    W8A8."""
    _check(x, w13, w2, topk_weights, topk_ids)
    top_k = topk_ids.shape[1]
    flat_ids, flat_weights = topk_ids.reshape(-1), topk_weights.reshape(-1).float()
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for expert in flat_ids.unique().tolist():
        pairs = (flat_ids == expert).nonzero().squeeze(1)
        tokens = pairs // top_k
        hidden = silu_and_mul_ref(_expert_linear(x[tokens], w13, expert))
        expert_out = _expert_linear(hidden, w2, expert)
        out.index_add_(0, tokens, expert_out.float() * flat_weights[pairs, None])
    return out.to(x.dtype)


@dataclass(frozen=True)
class MoeTiles:
    """Tile sizes of the grouped GEMMs (``block_m`` is also the sort's block)."""
    block_m: int = 16
    block_n: int = 64
    block_k: int = 64
    group_m: int = 1
    num_warps: int = 4
    num_stages: int = 3


def default_tiles(num_tokens: int, num_experts: int, top_k: int = 2) -> MoeTiles:
    """Tiles by the rows an expert gets on average (``num_tokens * top_k / num_experts``):
    few rows are weight-bandwidth bound (short M tiles, long K tiles), many compute bound
    (large tiles, more warps, M blocks grouped to share weight tiles in L2). Counting rows
    per expert rather than tokens fits Mixtral (8 experts, top-2) and Qwen3-MoE (128,
    top-8) alike: a decode step of 256 tokens gives 64 rows an expert in one, 16 in the
    other."""
    rows = num_tokens * top_k / max(num_experts, 1)
    block_m = next(size for limit, size in ((8, 16), (24, 32), (64, 64), (None, 128))
                   if limit is None or rows <= limit)
    small = rows <= 16
    return MoeTiles(block_m, 64 if small else 128, 128 if small else 64,
                    8 if rows > 256 else 1, 4 if rows <= 32 else 8, 4 if rows <= 8 else 3)


if tl is not None:
    @kernel
    def _moe_gemm_kernel(a_ptr, w_ptr, c_ptr, weights_ptr, w_scale_ptr, a_scale_ptr,
                         sorted_ids_ptr, expert_ids_ptr,
                         num_padded_ptr, N, K, num_pairs, num_blocks_m,
                         stride_am, stride_we, stride_wn, stride_wk, stride_cm, stride_se,
                         A_ROWS_PER_PAIR: tl.constexpr, MUL_WEIGHT: tl.constexpr,
                         HAS_W_SCALE: tl.constexpr, HAS_A_SCALE: tl.constexpr,
                         INT8: tl.constexpr,
                         DOT_PRECISION: tl.constexpr, BLOCK_M: tl.constexpr,
                         BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
        # FP8 weights: HAS_W_SCALE (per channel); W8A8 adds HAS_A_SCALE (per row of a).
        # INT8 (W8A8): int8 codes, an exact int32 accumulator, both scales after the loop.
        # Program -> (M block, N block), GROUP_M M blocks side by side per N column.
        pid_m, pid_n = moe_tile(tl.program_id(0), N, num_blocks_m, BLOCK_N, GROUP_M)
        if pid_m * BLOCK_M >= tl.load(num_padded_ptr):
            return
        pair, valid, expert, a_rows = moe_block_rows(sorted_ids_ptr, expert_ids_ptr, pid_m,
                                                     num_pairs, A_ROWS_PER_PAIR, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        a_ptrs = a_ptr + a_rows[:, None] * stride_am + offs_k[None, :]
        w_ptrs = (w_ptr + expert * stride_we + offs_n[None, :].to(tl.int64) * stride_wn
                  + offs_k[:, None] * stride_wk)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32 if INT8 else tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k_left = offs_k < K - k0
            a = tl.load(a_ptrs, mask=valid[:, None] & k_left[None, :], other=0.0)
            w = tl.load(w_ptrs, mask=k_left[:, None] & (offs_n[None, :] < N), other=0.0)
            if INT8:
                acc = tl.dot(a, w, acc, out_dtype=tl.int32)
            else:
                acc = tl.dot(a, w.to(a.dtype), acc, input_precision=DOT_PRECISION)
            a_ptrs += BLOCK_K
            w_ptrs += BLOCK_K * stride_wk
        acc = acc.to(tl.float32)
        if HAS_W_SCALE:
            acc = acc * tl.load(w_scale_ptr + expert * stride_se + offs_n, mask=offs_n < N,
                                other=0.0)[None, :]
        if HAS_A_SCALE:
            acc = acc * tl.load(a_scale_ptr + a_rows, mask=valid, other=0.0)[:, None]
        if MUL_WEIGHT:
            acc = acc * tl.load(weights_ptr + pair, mask=valid, other=0.0)[:, None]
        c_ptrs = c_ptr + pair.to(tl.int64)[:, None] * stride_cm + offs_n[None, :]
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty),
                 mask=valid[:, None] & (offs_n[None, :] < N))


def _grouped_gemm(a: torch.Tensor, w: ExpertWeights, out: torch.Tensor, blocks: ExpertBlocks,
                  a_rows_per_pair: int, weights: torch.Tensor | None, tiles: MoeTiles,
                  a_scale: torch.Tensor | None = None) -> None:
    """out[pair] = a[pair // a_rows_per_pair] @ w[expert(pair)].T (times weights[pair]);
    ``a_scale`` float32 [rows of a] (block FP8: [rows of a, K groups]): a is FP8 or int8
    codes of a * a_scale (W8A8)."""
    if isinstance(w, WNA16Experts):
        from tamis.kernels.fused_moe_wna16 import grouped_gemm_wna16
        grouped_gemm_wna16(a, w, out, blocks, a_rows_per_pair, weights, tiles)
        return
    if isinstance(w, Fp8BlockExperts):
        from tamis.kernels.fused_moe_fp8_block import grouped_gemm_fp8_block
        grouped_gemm_fp8_block(a, w, out, blocks, a_rows_per_pair, weights, tiles, a_scale)
        return
    scaled = isinstance(w, (Fp8Experts, Int8Experts))
    w_scale = w.scale if scaled else None
    w = w.weight if scaled else w
    n, k = w.shape[1], w.shape[2]
    num_blocks_m = blocks.sorted_ids.numel() // tiles.block_m
    grid = (num_blocks_m * triton.cdiv(n, tiles.block_n),)
    _moe_gemm_kernel[grid](
        a, w, out, weights if weights is not None else out,
        w_scale if w_scale is not None else out, a_scale if a_scale is not None else out,
        blocks.sorted_ids, blocks.expert_ids,
        blocks.num_padded, n, k, blocks.num_pairs, num_blocks_m,
        a.stride(0), w.stride(0), w.stride(1), w.stride(2), out.stride(0),
        w_scale.stride(0) if w_scale is not None else 0,
        A_ROWS_PER_PAIR=a_rows_per_pair, MUL_WEIGHT=weights is not None,
        HAS_W_SCALE=w_scale is not None, HAS_A_SCALE=a_scale is not None,
        INT8=a.dtype == torch.int8,
        DOT_PRECISION="ieee" if a.dtype == torch.float32 else "tf32",
        BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k,
        GROUP_M=tiles.group_m, num_warps=tiles.num_warps, num_stages=tiles.num_stages)


def quantized_activations(x: torch.Tensor, w: ExpertWeights,
                          w8a8: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(GEMM input, its scale): int8 codes of x per token (scale [M]) for INT8 experts;
    with ``w8a8``, FP8 codes of x per token or by the static input scale (scale [M]) for
    FP8 experts, per token and K group (scale [M, K groups]) for block FP8 ones; else x."""
    if isinstance(w, Int8Experts):
        from tamis.kernels.int8 import per_token_quant_int8
        codes, scale = per_token_quant_int8(x)
        return codes, scale.reshape(-1)
    if w8a8 and isinstance(w, Fp8BlockExperts):
        from tamis.kernels.fp8_block import per_token_group_quant_fp8
        return per_token_group_quant_fp8(x, w.block[1])
    if not (w8a8 and isinstance(w, Fp8Experts)):
        return x, None
    from tamis.kernels.fp8 import per_token_quant_fp8, quantize_fp8
    if w.input_scale is None:
        codes, scale = per_token_quant_fp8(x)
        return codes, scale.reshape(-1)
    scale = w.input_scale.float().reshape(1, 1)
    return quantize_fp8(x, scale), scale.expand(x.shape[0], 1).reshape(-1).contiguous()


def use_w8a8(x: torch.Tensor) -> bool:
    """FP8 experts (per channel or block-wise) multiply as FP8 on GPUs with FP8 tensor cores."""
    return x.is_cuda and _fp8_tensor_cores(x.device.index or 0)


@functools.cache
def _fp8_tensor_cores(device_index: int) -> bool:
    # Asked once per device, not per layer and step.
    from tamis.kernels.fp8 import fp8_supported
    return fp8_supported(torch.device("cuda", device_index))


def fused_experts_triton(x: torch.Tensor, w13: ExpertWeights, w2: ExpertWeights,
                         topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                         tiles: MoeTiles | None = None,
                         w8a8: bool | None = None) -> torch.Tensor:
    """The sorted grouped-GEMM path; ``tiles`` defaults to ``default_tiles`` for M;
    ``w8a8`` (FP8 experts only; INT8 ones are always W8A8) defaults to ``use_w8a8(x)``."""
    _check(x, w13, w2, topk_weights, topk_ids)
    num_tokens, top_k = topk_ids.shape
    if num_tokens == 0:
        return torch.empty_like(x)
    if isinstance(w13, torch.Tensor):
        w13, w2 = w13.contiguous(), w2.contiguous()
    x = x.contiguous()
    w8a8 = use_w8a8(x) if w8a8 is None else w8a8
    (experts, two_i, _), hidden_size = expert_shape(w13), x.shape[1]
    tiles = tiles or default_tiles(num_tokens, experts, top_k)
    blocks = align_by_expert(topk_ids, experts, tiles.block_m)
    pairs = num_tokens * top_k
    gate_up = torch.empty(pairs, two_i, dtype=x.dtype, device=x.device)
    a, a_scale = quantized_activations(x, w13, w8a8)
    _grouped_gemm(a, w13, gate_up, blocks, top_k, None, tiles, a_scale)
    hidden = silu_and_mul_triton(gate_up)
    weighted = torch.empty(pairs, hidden_size, dtype=x.dtype, device=x.device)
    flat_weights = topk_weights.reshape(-1).float().contiguous()
    a, a_scale = quantized_activations(hidden, w2, w8a8)
    _grouped_gemm(a, w2, weighted, blocks, 1, flat_weights, tiles, a_scale)
    return weighted.view(num_tokens, top_k, -1).sum(dim=1)


def fused_experts(x: torch.Tensor, w13: ExpertWeights, w2: ExpertWeights,
                  topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
    """The Triton path on CUDA, the reference elsewhere (see the module docstring)."""
    if use_triton(x):
        return fused_experts_triton(x, w13, w2, topk_weights, topk_ids)
    return fused_experts_ref(x, w13, w2, topk_weights, topk_ids)
