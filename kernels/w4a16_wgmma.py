"""W4A16 GEMM on Hopper's warpgroup MMA (``wgmma``) with the weight dequantized straight
into the A operand's registers (Gluon, sm_90), for batches of 17..128 rows of x.

Why a third kernel. ``tamis.kernels.w4a16_mma`` issues ``mma.sync`` per warp and loads
x fragments into every warp; past 16 rows of x its programs either re-dequantize the
weight once per 16 rows or spend registers on x. ``wgmma`` takes its A operand from
registers and its B operand from shared memory, and is 64 x N x 16 per warpgroup with N
up to 256: one dequantized weight tile multiplies all rows of x of the program, and x
is read from shared memory by the tensor cores, not by the threads. The shapes
``tamis.kernels.w4a16_wgmma_tma`` takes (natural K order, TMA-fed, fewer instructions)
go there; this kernel keeps the rest (32-row groups, K % 64 != 0).

Orientation and layout as in ``tamis.kernels.w4a16_mma`` (out^T = W^T x^T; the stored
words of ``mma_pack``; K visited in its permuted order inside each 32-row block, so a
thread's A fragment of two k16 steps is one word): the weight is A (64 output columns
per warpgroup), x^T [BLOCK_K, BLOCK_M] is B. Per program:

1. Word tiles and x^T tiles (K rows in the permuted order, each row of x gathered in
   pairs of values) stream through one ring of ``STAGES`` shared buffers with
   ``cp.async``, ``STAGES - 1`` steps ahead of the one being multiplied: a slot is
   refilled only after every warp has passed the barrier that follows its last read
   and its wait for the wgmma that read it.
2. Per word, the inline PTX of ``tamis.kernels.w4a16_fragments._UNPACK_SCALED`` gives
   ((q - z) * s) as bf16x2 (the group scale folded into the weight, so the accumulator
   chains through every step): 3 shifts, 4 lop3, 4 fma for q - z (exact) and 4 fma for
   the scale (one rounding to bf16, as Marlin-class kernels do).
3. ``warpgroup_mma``, then a wait for it before the next step's unpack. Leaving it
   running during the next unpack (``num_outstanding=1``) gives wrong results: the
   SASS reuses the A operand's registers
   for the next step's address arithmetic while the wgmma still reads them (passing
   the tile to ``warpgroup_mma_wait``'s deps did not keep them: a loop-carried value
   may move). Overlap comes from the other warpgroups of the multiprocessor, and with
   ``pairs`` from two steps issued before one wait: the second step's unpack runs while
   the first wgmma does, and both tiles, used by that wait, stay where they are
   (checked on the SASS in CI: ``tests/kernels/test_w4a16_sm90_build.py``; the
   default up to 32 rows, where it wins).

K is split over programs as in the other W4A16 kernels (the last program of a tile sums
the partials in split order, ``tamis.kernels.splitk``). Scales and zero points load
``params_ahead`` (by default two) steps ahead.

Needs: a CUDA device of compute capability 9.x, Gluon (triton >= 3.5), bf16 x, the
``mma_pack`` layout (``mma_layout_supported``), groups a multiple of 32 rows or the whole
K, K % 32 == 0.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from tamis.kernels import pdl
from tamis.kernels.splitk import even_split, sm_count, split_buffers
from tamis.kernels._gluon import gluon
from tamis.kernels.w4a16_common import step_rows, tensor_core_weight_supported

if gluon is not None:
    from triton.experimental.gluon.language.nvidia.ampere import async_copy
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared, warpgroup_mma, warpgroup_mma_wait)

    from tamis.kernels._gluon import (async_load, gdc_launch_dependents, gdc_wait, gl,
                                      thread_barrier)
    from tamis.kernels.w4a16_fragments import (as_bf16x2, column_order, constexpr_min,
                                               physical_columns, physical_rows,
                                               store_out_t, unpack_tile_scaled,
                                               word_layout)

WGMMA_MAX_M = 128
WGMMA_MIN_N = 8192   # wide layers (gate/up of an 8B model)
WGMMA_DEEP_K = 8192  # deep layers (down of an 8B model)
SHARED_BYTES = 200 * 1024   # of Hopper's 227 KB per block: the ring of tiles


@dataclass(frozen=True)
class WgmmaConfig:
    block_n: int = 64         # output columns per program: 64 per warpgroup and MMA
    block_k: int = 128        # rows of K per step (inside one group)
    split_k: int = 4          # programs along K per column block
    num_warps: int = 4        # 4 (one warpgroup) or 8
    stages: int = 3           # ring slots of (word, x^T) tiles; stages - 1 in flight
    # Steps in pairs, the second step's unpack overlapping the first's wgmma (stages - 2
    # in flight; needs 3 stages). Hazard-checked for sm_90 in CI; the default up to 32
    # rows, where it wins.
    pairs: bool = False
    # Steps ahead that the scales and zero points load (1 or 2): each step's come from
    # DRAM (a new group per step), so one step ahead leaves a memory round trip in
    # every step's critical path.
    params_ahead: int = 2


def pick_wgmma_config(m: int, n: int, k: int, group_size: int,
                      num_sms: int = 132) -> WgmmaConfig:
    """Tiles, the fastest of their sweeps with weights read from DRAM
    (bench/results/quant.md), steps of ``step_rows``. Wide layers (N >= 8192): 128
    columns on one warpgroup, K unsplit; up to 32 rows steps in pairs over three ring
    slots, else two slots. Other layers up to 32 rows: 64 columns, K split 4 ways, steps
    in pairs over four slots. Above: deep layers (K >= 8192) 128 columns, K split 4 ways,
    two slots; others 64 columns on three slots, K split until the column blocks make
    about two programs per multiprocessor (at least 16 steps a split)."""
    block_k = step_rows(k, group_size)
    if n >= WGMMA_MIN_N:
        if m <= 32:
            return WgmmaConfig(128, block_k, 1, stages=3, pairs=True)
        return WgmmaConfig(128, block_k, 1, stages=2)
    if m <= 32:  # K split 4 ways won every narrow cell
        return WgmmaConfig(64, block_k, 4, stages=4, pairs=True)
    if k >= WGMMA_DEEP_K:
        return WgmmaConfig(128, block_k, 4, stages=2)
    blocks = -(-n // 64)
    split = 1
    while blocks * split < 2 * num_sms and k // (block_k * split) >= 16:
        split *= 2
    return WgmmaConfig(64, block_k, split, stages=3)


def wgmma_dispatch(m: int, n: int, k: int) -> bool:
    """Whether a call of M rows on a [K, N] layer runs here (where the TMA kernel does
    not take it): 17..32 rows on every layer; 33..64 rows on wide (N >= 8192) or deep
    (K >= 8192) layers, where it beats the MMA-fragment and tl.dot kernels; at 33..64
    rows on 4096-deep narrow layers tl.dot ties or wins (bench/results/quant.md)."""
    if 16 < m <= 32:
        return True
    return 32 < m <= 64 and (n >= WGMMA_MIN_N or k >= WGMMA_DEEP_K)


def shared_bytes(config: WgmmaConfig, m: int) -> int:
    """Shared memory of one program: ``stages`` word tiles and x^T tiles."""
    return config.stages * config.block_k * (config.block_n // 2 + wgmma_block_m(m) * 2)


if gluon is not None:

    @gluon.jit
    def _group_params(z_ptr, s_ptr, stride_sg, k, K, offs_n, mask_n,
                      GROUP_SIZE: gl.constexpr):
        """(-(128 + z), s) of the group of row k (clamped to K - 1) as bf16x2 pairs."""
        g = gl.minimum(k, K - 1) // GROUP_SIZE
        z = gl.load(z_ptr + g * stride_sg + offs_n, mask=mask_n, other=0.0)
        s = gl.load(s_ptr + g * stride_sg + offs_n, mask=mask_n, other=0.0)
        return as_bf16x2(-(z.to(gl.float32) + 128.0)), as_bf16x2(s.to(gl.float32))

    @gluon.jit
    def _copy_step(w_dst, x_dst, w_ptrs, x_ptrs, step, k_lo, K, offs_wr, offs_xk, mask_wn,
                   mask_xm, stride_qk, NSTEPS, BLOCK_K: gl.constexpr, EVEN: gl.constexpr):
        """Start the copies of step ``step``'s word tile and x^T tile (K rows in the
        permuted order, gathered in pairs) and commit them as one group. Past the
        split's last step: with EVEN the last tiles again (never read), else masked to
        zeros, as are rows past K, columns past N and rows of x past M."""
        _copy_words(w_dst, w_ptrs, step, k_lo, K, offs_wr, mask_wn, stride_qk, NSTEPS,
                    BLOCK_K, EVEN)
        _copy_x(x_dst, x_ptrs, step, k_lo, K, offs_xk, mask_xm, NSTEPS, BLOCK_K, EVEN)
        async_copy.commit_group()

    @gluon.jit
    def _copy_words(w_dst, w_ptrs, step, k_lo, K, offs_wr, mask_wn, stride_qk, NSTEPS,
                    BLOCK_K: gl.constexpr, EVEN: gl.constexpr):
        """``_copy_step``'s word tile, uncommitted."""
        if EVEN:
            step = gl.minimum(step, NSTEPS - 1)
            async_load(w_dst, w_ptrs + step * (BLOCK_K // 8) * stride_qk)
        else:
            w_ok = (k_lo + step * BLOCK_K + offs_wr * 8 < K)[None, :] & (step < NSTEPS)
            async_load(w_dst, w_ptrs + step * (BLOCK_K // 8) * stride_qk, mask=mask_wn & w_ok)

    @gluon.jit
    def _copy_x(x_dst, x_ptrs, step, k_lo, K, offs_xk, mask_xm, NSTEPS,
                BLOCK_K: gl.constexpr, EVEN: gl.constexpr):
        """``_copy_step``'s x^T tile, uncommitted."""
        if EVEN:
            step = gl.minimum(step, NSTEPS - 1)
            async_load(x_dst, x_ptrs + step * BLOCK_K, mask=mask_xm)
        else:
            x_ok = (k_lo + step * BLOCK_K + offs_xk < K)[:, None] & (step < NSTEPS)
            async_load(x_dst, x_ptrs + step * BLOCK_K, mask=mask_xm & x_ok)

    @gluon.jit
    def _issue_step(acc, i, nzz, ss, nzz1, ss1, w_smem, x_smem, w_ptrs, x_ptrs, z_ptr, s_ptr,
                    stride_sg, stride_qk, k_lo, K, offs_wr, offs_xk, offs_zn, mask_wn, mask_xm,
                    mask_zn, NSTEPS, GROUP_SIZE: gl.constexpr, BLOCK_K: gl.constexpr,
                    STAGES: gl.constexpr, AHEAD: gl.constexpr, WL: gl.constexpr,
                    A_LAYOUT: gl.constexpr, ORDER: gl.constexpr, EVEN: gl.constexpr,
                    PARAMS_AHEAD: gl.constexpr):
        """Step i: wait for its tiles, refill the ring AHEAD steps on, unpack its weight
        tile (zero points and scales nzz, ss) and issue its wgmma (left running).
        (nzz1, ss1) are step i + 1's parameters, with PARAMS_AHEAD == 2 already loaded
        (else unused). Returns (acc, the weight tile the wgmma reads, step i + 1's
        parameters, step i + 2's (PARAMS_AHEAD == 2; else step i + 1's again))."""
        async_copy.wait_group(AHEAD - 1)  # this thread's copies of step i landed
        fence_async_shared()               # ... visible to the tensor cores
        thread_barrier()                   # every thread's copies, and every warp is past
                                           # its reads of the slot refilled next
        ahead = i + AHEAD
        _copy_step(w_smem.index(ahead % STAGES), x_smem.index(ahead % STAGES), w_ptrs,
                   x_ptrs, ahead, k_lo, K, offs_wr, offs_xk, mask_wn, mask_xm, stride_qk,
                   NSTEPS, BLOCK_K, EVEN)
        words = w_smem.index(i % STAGES).load(WL)
        nzz_next, ss_next = _group_params(z_ptr, s_ptr, stride_sg,
                                          k_lo + (i + PARAMS_AHEAD) * BLOCK_K, K,
                                          offs_zn, mask_zn, GROUP_SIZE)
        w = unpack_tile_scaled(words, nzz[:, None], ss[:, None], A_LAYOUT, ORDER)
        acc = warpgroup_mma(w, x_smem.index(i % STAGES), acc, is_async=True)
        if PARAMS_AHEAD == 2:
            return acc, w, nzz1, ss1, nzz_next, ss_next
        return acc, w, nzz_next, ss_next, nzz_next, ss_next

    @gluon.jit
    def _w4_wgmma_kernel(
        x_ptr, qw_ptr, s_ptr, z_ptr, out_ptr, part_ptr, count_ptr,
        M, N, K, stride_xm, stride_qk, stride_sg, stride_om,
        GROUP_SIZE: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
        BLOCK_K: gl.constexpr, K_SPLIT, SPLIT, HAS_SPLIT: gl.constexpr,
        NUM_WARPS: gl.constexpr, STAGES: gl.constexpr, PAIRS: gl.constexpr,
        PARAMS_AHEAD: gl.constexpr, EVEN: gl.constexpr,
        PDL: gl.constexpr, PDL_TRIGGER: gl.constexpr,
    ):
        if PDL_TRIGGER == 1:
            gdc_launch_dependents()
        MMA: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[NUM_WARPS, 1], instr_shape=[16, BLOCK_M, 16])
        A_LAYOUT: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
        ORDER: gl.constexpr = column_order(gl.to_linear_layout(A_LAYOUT, [BLOCK_N, BLOCK_K]),
                                           False)
        WL: gl.constexpr = word_layout(gl.to_linear_layout(A_LAYOUT, [BLOCK_N, BLOCK_K]), ORDER)
        XG: gl.constexpr = gl.BlockedLayout([2, 1], [16, 2], [NUM_WARPS, 1], [0, 1])
        # K contiguous; the swizzle spans one step's row of x^T (64 bytes at 32 rows).
        XS: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=constexpr_min(128, 2 * BLOCK_K),
                                                element_bitwidth=16, rank=2, transposed=True)
        WS: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[0, 1])  # N contiguous
        NSTEPS = K_SPLIT // BLOCK_K
        # Steps in flight past the one being multiplied; with PAIRS one fewer, since
        # the slot of the step before is still read by its wgmma.
        AHEAD: gl.constexpr = STAGES - 1 - PAIRS

        pid_n = gl.program_id(0)
        pid_k = gl.program_id(1)
        pid_m = gl.program_id(2)
        k_lo = pid_k * K_SPLIT

        offs_wn = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, WL))
        offs_wr = gl.arange(0, BLOCK_K // 8, layout=gl.SliceLayout(0, WL))
        mask_wn = (offs_wn < N)[:, None]
        w_ptrs = qw_ptr + (k_lo // 8 + offs_wr)[None, :] * stride_qk + offs_wn[:, None]
        offs_xk = gl.arange(0, BLOCK_K, layout=gl.SliceLayout(1, XG))
        offs_xm = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, XG))
        mask_xm = (offs_xm < M)[None, :]
        # Logical rows 2j, 2j + 1 are physical rows p, p + 1 with p even: pairs of values.
        x_offs = offs_xm[None, :] * stride_xm + (k_lo + physical_rows(offs_xk))[:, None]
        x_ptrs = x_ptr + gl.max_contiguous(gl.multiple_of(x_offs, [2, 1]), [2, 1])

        w_smem = gl.allocate_shared_memory(gl.int32, [STAGES, BLOCK_N, BLOCK_K // 8], WS)
        x_smem = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_K, BLOCK_M], XS)
        # The ring's first AHEAD word tiles, and the scales and zero points (in the
        # layout of the words' columns, PARAMS_AHEAD steps ahead), load before the wait
        # for the kernel before (PDL, ``tamis.kernels.pdl``); x^T after it, each step's
        # tile closing the step's copy group (the first group holds every word tile).
        for step in gl.static_range(AHEAD):
            _copy_words(w_smem.index(step), w_ptrs, step, k_lo, K, offs_wr, mask_wn,
                        stride_qk, NSTEPS, BLOCK_K, EVEN)
        offs_zn = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, WL))
        mask_zn = offs_zn < N
        nzz, ss = _group_params(z_ptr, s_ptr, stride_sg, k_lo, K, offs_zn, mask_zn, GROUP_SIZE)
        nzz1, ss1 = nzz, ss
        if PARAMS_AHEAD == 2:
            nzz1, ss1 = _group_params(z_ptr, s_ptr, stride_sg, k_lo + BLOCK_K, K, offs_zn,
                                      mask_zn, GROUP_SIZE)
        if PDL:
            gdc_wait()
        for step in gl.static_range(AHEAD):
            _copy_x(x_smem.index(step), x_ptrs, step, k_lo, K, offs_xk, mask_xm, NSTEPS,
                    BLOCK_K, EVEN)
            async_copy.commit_group()

        acc = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, MMA)
        if PAIRS:
            # The second step's unpack overlaps the first step's wgmma; both tiles stay
            # live until the wait that retires both (tests/kernels/sm90_build.py checks
            # that no instruction overwrites them in between).
            for i in range(0, NSTEPS - 1, 2):
                acc, w_a, nzz, ss, nzz1, ss1 = _issue_step(
                    acc, i, nzz, ss, nzz1, ss1, w_smem, x_smem, w_ptrs, x_ptrs, z_ptr, s_ptr,
                    stride_sg, stride_qk, k_lo, K, offs_wr, offs_xk, offs_zn, mask_wn, mask_xm,
                    mask_zn, NSTEPS, GROUP_SIZE, BLOCK_K, STAGES, AHEAD, WL, A_LAYOUT, ORDER,
                    EVEN, PARAMS_AHEAD)
                acc, w_b, nzz, ss, nzz1, ss1 = _issue_step(
                    acc, i + 1, nzz, ss, nzz1, ss1, w_smem, x_smem, w_ptrs, x_ptrs, z_ptr, s_ptr,
                    stride_sg, stride_qk, k_lo, K, offs_wr, offs_xk, offs_zn, mask_wn, mask_xm,
                    mask_zn, NSTEPS, GROUP_SIZE, BLOCK_K, STAGES, AHEAD, WL, A_LAYOUT, ORDER,
                    EVEN, PARAMS_AHEAD)
                acc, w_a, w_b = warpgroup_mma_wait(num_outstanding=0, deps=[acc, w_a, w_b])
            first_single = NSTEPS - NSTEPS % 2
        else:
            first_single = 0
        for i in range(first_single, NSTEPS):
            acc, w, nzz, ss, nzz1, ss1 = _issue_step(
                acc, i, nzz, ss, nzz1, ss1, w_smem, x_smem, w_ptrs, x_ptrs, z_ptr, s_ptr,
                stride_sg, stride_qk, k_lo, K, offs_wr, offs_xk, offs_zn, mask_wn, mask_xm, mask_zn,
                NSTEPS, GROUP_SIZE, BLOCK_K, STAGES, AHEAD, WL, A_LAYOUT, ORDER, EVEN,
                PARAMS_AHEAD)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=[acc])
        async_copy.wait_group(0)
        if PDL_TRIGGER == 2:
            gdc_launch_dependents()

        offs_cn = pid_n * BLOCK_N + physical_columns(
            gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, MMA)), ORDER)
        offs_cm = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, MMA))
        store_out_t(acc, out_ptr, part_ptr, count_ptr, offs_cm, offs_cn,
                    (offs_cm < M)[None, :] & (offs_cn < N)[:, None], stride_om, M, N,
                    pid_m, pid_n, pid_k, SPLIT, HAS_SPLIT)


def wgmma_block_m(m: int) -> int:
    """Rows of x per program (the wgmma's N): M rounded up to 16, 32, 64 or 128."""
    for block_m in (16, 32, 64, 128):
        if m <= block_m:
            return block_m
    return WGMMA_MAX_M


def wgmma_constexprs(config: WgmmaConfig, block_m: int, group_size: int, splits: int,
                     even: bool, *, pdl_wait: bool = False, pdl_trigger: int = 0) -> dict:
    """The compile-time arguments of ``_w4_wgmma_kernel`` for a launch of ``splits``
    programs along K (shared with the sm_90 build tests, so that they build what runs)."""
    return dict(GROUP_SIZE=group_size, BLOCK_M=block_m, BLOCK_N=config.block_n,
                BLOCK_K=config.block_k, HAS_SPLIT=splits > 1, NUM_WARPS=config.num_warps,
                STAGES=config.stages, PAIRS=config.pairs,
                PARAMS_AHEAD=config.params_ahead, EVEN=even, PDL=pdl_wait,
                PDL_TRIGGER=pdl_trigger)


def w4a16_gemm_wgmma(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor,
                     zeros: torch.Tensor, group_size: int,
                     config: WgmmaConfig | None = None) -> torch.Tensor:
    """``w4a16_gemm_ref`` for x [M, K] bf16 (M <= ``WGMMA_MAX_M``) on a Hopper GPU, the
    weight in ``mma_pack``'s layout (integer zero points in [0, 16])."""
    if gluon is None:
        raise RuntimeError("w4a16_gemm_wgmma needs triton with Gluon")
    m, k = x.shape
    n = packed.shape[1]
    if (x.dtype != torch.bfloat16 or m > WGMMA_MAX_M
            or not tensor_core_weight_supported(k, group_size, 4)):
        raise ValueError(f"wgmma path takes bf16 x with M <= {WGMMA_MAX_M}, K % 32 == 0 "
                         f"and 32-row groups; got M={m}, K={k}, group {group_size}, {x.dtype}")
    x = x.contiguous()
    config = config or pick_wgmma_config(m, n, k, group_size, sm_count(x))
    if group_size < k and group_size % config.block_k:
        raise ValueError(f"block_k {config.block_k} does not divide the group size {group_size}")
    if config.num_warps not in (4, 8) or config.block_n % (16 * config.num_warps):
        raise ValueError(f"WgmmaConfig needs 4 or 8 warps and 16 columns per warp; got "
                         f"{config.num_warps} warps, block_n {config.block_n}")
    block_m = wgmma_block_m(m)
    splits, k_split = even_split(k, config.block_k, config.split_k)
    if config.params_ahead not in (1, 2):
        raise ValueError(f"WgmmaConfig takes params_ahead 1 or 2; got {config.params_ahead}")
    if config.stages < 2 + config.pairs:
        raise ValueError(f"WgmmaConfig needs at least {2 + config.pairs} stages"
                         f"{' with pairs' if config.pairs else ''}; got {config.stages}")
    shared = shared_bytes(config, m)
    if shared > SHARED_BYTES:
        raise ValueError(f"{config.stages} stages of {config.block_k}-row tiles at "
                         f"{block_m} rows need {shared} bytes of shared memory (at most "
                         f"{SHARED_BYTES}): fewer stages")
    blocks = -(-n // config.block_n)
    m_blocks = -(-m // block_m)
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    partials, counters = split_buffers(out, splits, (m, n), blocks * m_blocks)
    _w4_wgmma_kernel[(blocks, splits, m_blocks)](
        x, packed, scales, zeros, out, partials, counters,
        m, n, k, x.stride(0), packed.stride(0), scales.stride(0), out.stride(0),
        K_SPLIT=k_split, SPLIT=splits,
        **wgmma_constexprs(config, block_m, min(group_size, k), splits,
                           k % k_split == 0 and n % config.block_n == 0,
                           pdl_wait=pdl.launch(x.device), pdl_trigger=pdl.trigger(x.device, m)),
        num_warps=config.num_warps, launch_pdl=pdl.launch(x.device),
    )
    return out
