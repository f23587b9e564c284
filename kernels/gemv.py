"""Row-streaming GEMV for decode: ``y = x @ (weight * scale).T`` for a few rows of x.

```
x             [M, K], M <= GEMV_MAX_M, bf16 / fp16 / fp32
weight        [N, K] in any float dtype (float8_e4m3fn for W8A16, bf16 / fp16 dense)
weight_scale  float32 [N] per output channel, or None
```

Each program streams a [BLOCK_N, BLOCK_K] tile of weight rows (16-byte loads along K),
converts it to fp32 in registers and accumulates ``w * x`` in fp32; the scale is applied
once at the end. K is split over programs and reduced in the same launch
(``tamis.kernels.splitk``). It serves FP8 checkpoints at decode (``fp8_gemv_triton``) and
dense bf16 / fp16 layers at batch 1 (``linear``), where cuBLAS splits K with a second
kernel. On Hopper it launches with programmatic dependent launch (``tamis.kernels.pdl``),
waiting for the kernel before it as it starts.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tamis.kernels import pdl
from tamis.kernels._triton import kernel, use_triton
from tamis.kernels.splitk import even_split, last_split_constexpr, sm_count, split_buffers

try:
    import triton
    import triton.language as tl
    from tamis.kernels.pdl import gdc_launch_dependents, gdc_wait
except ImportError:  # CPU-only installs without triton
    triton = None


@dataclass(frozen=True)
class GemvTiles:
    block_n: int   # weight rows (output columns) per program
    block_k: int   # K elements per loop step
    split_k: int   # programs along K per row block (reduced in the same launch)
    num_warps: int = 4
    num_stages: int = 3
    prefetch: bool = False  # load the next weight tile before using this one
    # Software-pipeline the loop's loads through shared memory, this many tiles deep
    # (1 = plain loads; Triton pipelines loads that feed no tl.dot only in a tl.range
    # loop given num_stages).
    loop_stages: int = 1
    # Split K summed by the last split, the others not waiting for the counter (as in
    # ``tamis.kernels.w4a16_fragments._reduce_at_last_split``), instead of by the last
    # split to arrive.
    last_split_reduces: bool = False


GEMV_MAX_M = 4      # rows the GEMV kernel takes


def pick_gemv_tiles(m: int, n: int, k: int, num_sms: int = 132,
                    weight_bytes: int = 1) -> GemvTiles:
    """Tiles from sweeps of this kernel on an H200 (FP8 figures: bench/results/quant.md).

    One row of fp8 weights read from DRAM (16 weight copies cycled): 8 rows per program
    and 1024 K per step, K unsplit, the programs all resident at once: 4 warps where the
    8-row blocks are at most 4 per SM (116 registers: 4 programs an SM), else 2 warps
    while they are at most 6 per SM (168 registers: 6 an SM). 4096 x 4096 6.1-6.3
    against 6.9-7.2 us, 14336 x 4096 15.8 against 16.5, 4096 x 6144 (2 warps) 8.6 against
    9.2-9.4. Wider layers keep the rule below (4096 x 28672: 29.9 us, no candidate faster).

    Otherwise: 16 rows per program; 512 K per step unless N alone gives 8 programs per SM
    (then 256, fewer live registers); K split until the programs' tiles hold 2 SMs' worth
    of 1-byte tiles (fp8 weights: 2 programs per SM; bf16, twice the bytes per tile,
    stops one split earlier: 4096x4096 6.6 us unsplit against 7.9 split in 2); one row
    pipelines its loads 3 tiles deep (fp8 14336x4096 19.8 -> 17.4 us, an L2-resident
    weight). Several rows take 256 K per step."""
    if m == 1 and weight_bytes == 1:
        blocks_of_8 = -(-n // 8)
        if blocks_of_8 <= 4 * num_sms:
            return GemvTiles(8, 1024, 1, 4, loop_stages=3)
        if blocks_of_8 <= 6 * num_sms:
            return GemvTiles(8, 1024, 1, 2, loop_stages=3)
    block_n = 16
    blocks = -(-n // block_n)
    block_k = 512 if m == 1 and blocks < 8 * num_sms else 256
    split_k = 1
    while blocks * split_k * weight_bytes < 2 * num_sms and split_k < 16:
        split_k *= 2
    return GemvTiles(block_n, block_k, split_k, loop_stages=3 if m == 1 else 1)


if triton is not None:

    # Dual-mode (compiled for CUDA tensors, interpreted for CPU ones, whatever
    # TRITON_INTERPRET was at import): the engine's dense layers call it.
    @kernel
    def _gemv_kernel(x_ptr, w_ptr, ws_ptr, out_ptr, part_ptr, count_ptr,
                     M, N, K, K_SPLIT, stride_xm, stride_wn, stride_om,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     SPLIT, HAS_SPLIT: tl.constexpr, PREFETCH: tl.constexpr,
                     LOOP_STAGES: tl.constexpr, HAS_SCALE: tl.constexpr,
                     PDL: tl.constexpr, PDL_TRIGGER: tl.constexpr,
                     LAST_SPLIT_REDUCES: tl.constexpr):
        if PDL_TRIGGER == 1:
            gdc_launch_dependents()
        if PDL:  # launched beside the kernel before (tamis.kernels.pdl): x is its output
            gdc_wait()
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        mask_n = offs_n < N
        offs_k = tl.arange(0, BLOCK_K)
        m_k = tl.zeros((BLOCK_K,), dtype=tl.int32) + M  # M as tensors: row masks
        m_n = tl.zeros((BLOCK_N,), dtype=tl.int32) + M
        acc0 = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        acc1 = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        acc2 = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        acc3 = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        k_lo = pid_k * K_SPLIT
        k_hi = tl.minimum(k_lo + K_SPLIT, K)
        if PREFETCH:
            ahead = tl.load(w_ptr + offs_n[:, None] * stride_wn + (k_lo + offs_k)[None, :],
                            mask=mask_n[:, None] & ((k_lo + offs_k) < k_hi)[None, :], other=0.0)
        for k0 in tl.range(k_lo, k_hi, BLOCK_K, num_stages=LOOP_STAGES):
            kk = k0 + offs_k
            kmask = kk < k_hi
            if PREFETCH:
                w = ahead.to(tl.float32)
                nk = kk + BLOCK_K
                ahead = tl.load(w_ptr + offs_n[:, None] * stride_wn + nk[None, :],
                                mask=mask_n[:, None] & (nk < k_hi)[None, :], other=0.0)
            else:
                w = tl.load(w_ptr + offs_n[:, None] * stride_wn + kk[None, :],
                            mask=mask_n[:, None] & kmask[None, :], other=0.0).to(tl.float32)
            x0 = tl.load(x_ptr + kk, mask=kmask, other=0.0).to(tl.float32)
            acc0 += w * x0[None, :]
            if BLOCK_M > 1:
                x1 = tl.load(x_ptr + stride_xm + kk, mask=kmask & (m_k > 1),
                             other=0.0).to(tl.float32)
                acc1 += w * x1[None, :]
            if BLOCK_M > 2:
                x2 = tl.load(x_ptr + 2 * stride_xm + kk, mask=kmask & (m_k > 2),
                             other=0.0).to(tl.float32)
                acc2 += w * x2[None, :]
            if BLOCK_M > 3:
                x3 = tl.load(x_ptr + 3 * stride_xm + kk, mask=kmask & (m_k > 3),
                             other=0.0).to(tl.float32)
                acc3 += w * x3[None, :]
        if PDL_TRIGGER == 2:
            gdc_launch_dependents()
        if HAS_SCALE:
            scale = tl.load(ws_ptr + offs_n, mask=mask_n, other=0.0)
        else:
            scale = tl.full([BLOCK_N], 1.0, tl.float32)
        if not HAS_SPLIT:
            for m in tl.static_range(BLOCK_M):
                col = row_sums(acc0, acc1, acc2, acc3, m)
                tl.store(out_ptr + m * stride_om + offs_n,
                         (col * scale).to(out_ptr.dtype.element_ty), mask=mask_n & (m_n > m))
        elif LAST_SPLIT_REDUCES and pid_k == SPLIT - 1:
            # The partner splits have started (earlier blocks) and wait on nothing.
            arrived = tl.atomic_add(count_ptr + pid_n, 0, sem="acquire")
            while arrived < SPLIT - 1:
                arrived = tl.atomic_add(count_ptr + pid_n, 0, sem="acquire")
            tl.store(count_ptr + pid_n, 0)
            for m in tl.static_range(BLOCK_M):
                total = tl.zeros((BLOCK_N,), dtype=tl.float32)
                for sk in tl.static_range(LAST_SPLIT_REDUCES - 1):  # one round of loads
                    total += tl.load(part_ptr + (sk * BLOCK_M + m) * N + offs_n,
                                     mask=mask_n, other=0.0, cache_modifier=".cg")
                total += row_sums(acc0, acc1, acc2, acc3, m)
                tl.store(out_ptr + m * stride_om + offs_n,
                         (total * scale).to(out_ptr.dtype.element_ty), mask=mask_n & (m_n > m))
        else:
            for m in tl.static_range(BLOCK_M):
                tl.store(part_ptr + (pid_k * BLOCK_M + m) * N + offs_n,
                         row_sums(acc0, acc1, acc2, acc3, m), mask=mask_n)
            if LAST_SPLIT_REDUCES:
                tl.debug_barrier()  # every thread's partials are stored before the release
                tl.atomic_add(count_ptr + pid_n, 1, sem="release")
            else:
                sum_at_arrival(part_ptr, out_ptr, count_ptr + pid_n, offs_n, mask_n, m_n, N,
                               stride_om, scale, SPLIT, BLOCK_M, BLOCK_N)

    @triton.jit
    def sum_at_arrival(part_ptr, out_ptr, counter, offs_n, mask_n, m_n, N, stride_om, scale,
                       SPLIT, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        """Count this split in (its partials [SPLIT, BLOCK_M, N] stored); the split that
        counts last sums each row's partials in split order, scales them, stores out and
        resets the counter (``tamis.kernels.splitk``). Shared with the W4A16 GEMV."""
        tl.debug_barrier()  # every thread's partials are stored before the count
        done = tl.atomic_add(counter, 1)
        if done == SPLIT - 1:
            for m in tl.static_range(BLOCK_M):
                total = tl.zeros((BLOCK_N,), dtype=tl.float32)
                for sk in range(SPLIT):
                    total += tl.load(part_ptr + (sk * BLOCK_M + m) * N + offs_n,
                                     mask=mask_n, other=0.0, cache_modifier=".cg")
                tl.store(out_ptr + m * stride_om + offs_n,
                         (total * scale).to(out_ptr.dtype.element_ty), mask=mask_n & (m_n > m))
            tl.store(counter, 0)

    @triton.jit
    def row_sums(acc0, acc1, acc2, acc3, m: tl.constexpr, K_AXIS: tl.constexpr = 1):
        """Row m of x's products (acc0..acc3, one per row) summed over the tile's K axis:
        [BLOCK_N] fp32. Shared with the W4A16 GEMV (K on axis 0 there)."""
        if m == 0:
            col = tl.sum(acc0, axis=K_AXIS)
        elif m == 1:
            col = tl.sum(acc1, axis=K_AXIS)
        elif m == 2:
            col = tl.sum(acc2, axis=K_AXIS)
        else:
            col = tl.sum(acc3, axis=K_AXIS)
        return col


def gemv_triton(x: torch.Tensor, weight: torch.Tensor,
                weight_scale: torch.Tensor | None = None,
                config: GemvTiles | None = None) -> torch.Tensor:
    """``x @ (weight * weight_scale[:, None]).T`` for x [M, K], M <= GEMV_MAX_M, weight
    [N, K] in any float dtype, weight_scale float32 [N] or [1] (None: no scale); out in
    x's dtype."""
    if triton is None:
        raise RuntimeError("gemv_triton needs triton installed")
    m, k = x.shape
    n = weight.shape[0]
    if m > GEMV_MAX_M:
        raise ValueError(f"gemv_triton takes M <= {GEMV_MAX_M}, got {m}")
    if x.stride(1) != 1:
        x = x.contiguous()
    if weight.stride(1) != 1:
        weight = weight.contiguous()
    scale = weight_scale
    if scale is not None:
        scale = scale.float().reshape(-1)
        if scale.numel() == 1:
            scale = scale.expand(n).contiguous()
    config = config or pick_gemv_tiles(m, n, k, sm_count(x), weight.element_size())
    splits, k_split = even_split(k, config.block_k, config.split_k)
    blocks = triton.cdiv(n, config.block_n)
    block_m = 1 if m == 1 else (2 if m == 2 else 4)
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    partials, counters = split_buffers(out, splits, (block_m, n), blocks)
    _gemv_kernel[(blocks, splits)](
        x, weight, out if scale is None else scale, out, partials, counters, m, n, k, k_split,
        x.stride(0), weight.stride(0), out.stride(0),
        BLOCK_M=block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
        SPLIT=splits, HAS_SPLIT=splits > 1, PREFETCH=config.prefetch,
        LOOP_STAGES=config.loop_stages, HAS_SCALE=scale is not None,
        PDL=pdl.launch(x.device), PDL_TRIGGER=pdl.trigger(x.device, m),
        LAST_SPLIT_REDUCES=last_split_constexpr(config.last_split_reduces, splits),
        num_warps=config.num_warps, num_stages=config.num_stages,
        **({"launch_pdl": True} if pdl.launch(x.device) else {}))
    return out


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
           ) -> torch.Tensor:
    """``F.linear``, except a single row of bf16 / fp16 on CUDA (batch-1 decode), which
    runs ``gemv_triton``: on the H200 it beat cuBLAS at M = 1 on every Llama-3.1-8B layer
    shape (cuBLAS splits K there with a second reduction kernel). Layers with a bias keep
    cuBLAS, which adds it in the same call."""
    if (bias is None and x.numel() == x.shape[-1] and x.dtype == weight.dtype
            and x.dtype in (torch.bfloat16, torch.float16) and use_triton(x)):
        return gemv_triton(x.reshape(1, -1), weight).reshape(*x.shape[:-1], weight.shape[0])
    return F.linear(x, weight, bias)
