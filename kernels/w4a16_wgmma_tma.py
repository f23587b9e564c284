"""W4A16 GEMM on Hopper's warpgroup MMA with every tile brought in by the Tensor Memory
Accelerator (Gluon, sm_90), for batches of 9..256 rows of x (in blocks of 128 above 128).

Why a fourth kernel. ``tamis.kernels.w4a16_wgmma`` visits K in ``mma_pack``'s permuted
order, so its x^T tile must be gathered into shared memory two values at a time: at 64
rows of x that is 32 ``cp.async`` a thread per step, each with its own 64-bit address,
and its profile counts 1.9-3.7x cuBLAS's instructions (bench/results/quant.md). Here K
is visited in its natural order, so x and the words are plain 2-D boxes that one thread
asks the TMA for; the threads only unpack and multiply.

The natural order from the same stored words. Within a 32-row block of K, the word of
physical rows 8r .. 8r + 7 holds rows 8r + 2c and 8r + 2c + 1 at nibbles c and c + 4
(``mma_pack``'s interleaved nibbles), and an m16n8k16 A fragment wants, in lane c = lane
% 4, exactly rows 8r + 2c, 8r + 2c + 1 for r = 0..3. So every lane of a quad loads the
block's four words of its column, shifts each right by 4c, and one lop3 gives the pair:

    v = lop3(word >> 4c, 0x000F000F, 0x43004300)   # bf16x2 (128 + q_lo, 128 + q_hi)
    v = fma(v, 1, -(128 + z));  v = fma(v, s, -0)    # ((q - z) * s), one bf16 rounding

(4 instructions per pair of codes, against 15 per 8 codes in the permuted kernel: the
same work; what goes is the gather). The four lanes of a quad read the same words from
shared memory (a broadcast, no bank conflict).

Per program (``BLOCK_N`` output columns, 64 per warpgroup, and up to 128 rows of x): a
ring of ``stages`` slots, each holding per 64 rows of K one word box [8, BLOCK_N] (no
swizzle) and one x tile [BLOCK_M, 64] (128-byte swizzle: the wgmma's B operand as it
lands; one box, or two half boxes where ``x_box_rows`` says), all signalling the slot's
mbarrier. Each step waits for its slot, unpacks and issues one wgmma per 64 rows of K
(the second unpack runs while the first wgmma does), and after a barrier of the
program's threads (every warp has read the slot) refills the slot ``stages`` steps on.
With ``overlap`` (the default on wide layers above 32 rows) the next step's unpack also
runs while this step's wgmmas do: the tiles of a wgmma in flight stay live until the
wait that retires them, which the sm_90 build tests check on the SASS
(``tests/kernels/sm90_build.py``). K is split over programs as in the other W4A16
kernels (``tamis.kernels.splitk``). With programmatic dependent launch the ring's word
boxes, scales and zero points load before the wait for the kernel before; x after.

With ``producer_warp`` one more warp (``gl.warp_specialize``; ``_produce``) issues every
copy, waiting on each slot's "empty" mbarrier, which the warpgroup (``_consume``) arrives
on once all its threads have read the slot. Why: Triton's shared-memory barrier analysis
cannot tell that the copies of one step touch different boxes, and puts a barrier of
the program's threads before each copy and after its mbarrier's expect (6 barriers a
step with two 64-row boxes of each kind; in one warp they cost nothing, and the
warpgroup keeps 2). The price is registers: a program is then two warpgroups (three
warps of the second idle), capped at 128 registers a thread so that two share a
multiprocessor (``PRODUCER_WARP_MAXNREG``).

Needs: a Hopper GPU, Gluon with TMA (triton >= 3.5), bf16 x with 16-byte aligned rows
(K % 8 == 0), the ``mma_pack`` layout with integer zero points in [0, 16], N % 4 == 0,
groups a multiple of 64 rows or the whole K, K % 64 == 0 (``tma_supported``).
"""
from __future__ import annotations

import functools

import torch

from tamis.kernels import pdl
from tamis.kernels._gluon import gluon
from tamis.kernels.splitk import (even_split, last_split_constexpr, linear_partials_constexpr,
                                  partial_shape, sm_count, split_buffers)
from tamis.kernels.w4a16_tma_tiles import (SHARED_BYTES, TMA_MAX_M, X_BOX_K, TmaConfig,
                                           launched_rows, pick_tma_config, shared_bytes,
                                           slot_bytes, tma_block_m, x_box_rows)

if gluon is not None:
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared, mbarrier, warpgroup_mma, warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from tamis.kernels._gluon import (gdc_launch_dependents, gdc_wait, gl, thread_barrier,
                                      tma_load)
    from tamis.kernels.w4a16_fragments import (as_bf16x2, column_order, logical_columns,
                                               physical_columns, store_out_t)

PRODUCER_REGISTERS = 40  # the producer warp's registers (setmaxnreg)
# With the producer warp a program is two warpgroups (the producer's has three idle warps):
# registers capped so that two programs fit a multiprocessor. ptxas builds both partitions
# within the cap: the 64-column tiles fit without spills (sm_90 build tests), the wide
# layers' 128-column overlapped tile does not (8 bytes of stack).
PRODUCER_WARP_MAXNREG = 128


def tma_supported(m: int, n: int, k: int, group_size: int) -> bool:
    """Shapes the kernel takes (x's alignment is fixed at the call); a layer's kernel
    (``tamis.quant.wna16_kernels``) sends it those of bf16 x on a Hopper GPU whose rows
    ``tma_dispatch`` picks."""
    return (gluon is not None and 1 <= m <= TMA_MAX_M and k % X_BOX_K == 0 and n % 4 == 0
            and (group_size >= k or group_size % X_BOX_K == 0))


def tma_dispatch(m: int, n: int) -> bool:
    """Whether a call of M rows on N columns runs here (where ``tma_supported``): 17..256
    rows, and 9..16 on layers narrower than 8192 columns, where it beats every other
    kernel (bench/results/quant.md; at one row, and at 9..16 rows on 4096 x 28672, the
    MMA-fragment kernel wins; from 65 rows it beats tl.dot and dequantize + cuBLAS at
    every row count and shape measured)."""
    return 16 < m <= TMA_MAX_M or (8 < m <= 16 and n < 8192)


if gluon is not None:

    # $2 the word shifted right by 4c, $3 -(128 + z) twice, $4 the scale twice (bf16x2);
    # $0, $1 the bf16 pair ((q_lo - z) * s, (q_hi - z) * s).
    _BOX_K = gl.constexpr(X_BOX_K)
    _PRODUCER_REGISTERS = gl.constexpr(PRODUCER_REGISTERS)
    _slot_bytes = gluon.constexpr_function(slot_bytes)
    _UNPACK_PAIR = gl.constexpr("""{
 .reg .b32 v, one, nz;
 mov.b32 one, 0x3F803F80;
 mov.b32 nz, 0x80008000;
 lop3.b32 v, $2, 0x000F000F, 0x43004300, 0xEA;
 fma.rn.bf16x2 v, v, one, $3;
 fma.rn.bf16x2 v, v, $4, nz;
 mov.b32 {$0, $1}, v;
}""")

    @gluon.constexpr_function
    def _quad_layout(a_layout, order):
        """The layout of [BLOCK_N, _BOX_K / 8, 4] (physical column, word row r, lane c of
        the quad) whose unpacked pairs, joined on a last axis h and reshaped to [BLOCK_N,
        _BOX_K] (row 8r + 2c + h), are ``a_layout`` (the A operand's linear layout,
        bases [m, k]) with columns in physical order: k bases 2 and 4 become c, the others
        from 8 up word rows, k = 1 is h; column bases map m to its physical column
        (``order``), those in registers first so that a thread's words load as a vector."""
        def to_quad(basis):
            n, k = basis
            assert not (n and k), "A operand bases are columns or rows of K"
            if n:
                return [1 << order[n.bit_length() - 1], 0, 0]
            return [0, 0, k // 2] if k in (2, 4) else [0, k // 8, 0]
        regs = [to_quad(b) for b in a_layout.reg_bases if b != [0, 1]]
        regs = sorted(regs, key=lambda b: (b[0] == 0, b[0]))
        shape = [a_layout.shape[0], a_layout.shape[1] // 8, 4]
        return gl.DistributedLinearLayout(
            reg_bases=regs, lane_bases=[to_quad(b) for b in a_layout.lane_bases],
            warp_bases=[to_quad(b) for b in a_layout.warp_bases], block_bases=[], shape=shape)

    @gluon.constexpr_function
    def _words_layout(quad):
        """The layout of a word box [_BOX_K / 8, BLOCK_N] as loaded from shared memory:
        ``quad`` transposed, the lane bits of c broadcast (the four lanes of a quad hold
        the same words). Loaded in this layout and permuted in registers, because in
        Triton 3.6 a load through a permuted view of an unswizzled shared tile reads the
        wrong addresses."""
        def t(b):
            return [b[1], b[0]]
        return gl.DistributedLinearLayout(
            reg_bases=[t(b) for b in quad.reg_bases], lane_bases=[t(b) for b in quad.lane_bases],
            warp_bases=[t(b) for b in quad.warp_bases], block_bases=[],
            shape=[quad.shape[1], quad.shape[0]])

    @gluon.jit
    def _operand(w_box, nzz, ss, QUAD: gl.constexpr, WORDS: gl.constexpr,
                 A_LAYOUT: gl.constexpr, ORDER: gl.constexpr):
        """The A operand [BLOCK_N, _BOX_K] of a word box [_BOX_K / 8, BLOCK_N] in shared
        memory: ((q - z) * s) in bf16, logical columns, natural K order. nzz, ss:
        [BLOCK_N, 1, 1] bf16x2 pairs of the step's group."""
        words = gl.convert_layout(gl.permute(w_box.load(WORDS), (1, 0)),
                                  gl.SliceLayout(2, QUAD), assert_trivial=True)
        quad = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, QUAD)))
        shifted = words[:, :, None] >> (4 * quad)[None, None, :]
        lo, hi = gl.inline_asm_elementwise(_UNPACK_PAIR, "=h,=h,r,r,r", [shifted, nzz, ss],
                                           dtype=(gl.bfloat16, gl.bfloat16), is_pure=True,
                                           pack=1)
        t = gl.reshape(gl.join(lo, hi), [lo.shape[0], _BOX_K])
        return gl.convert_layout(logical_columns(t, ORDER), A_LAYOUT, assert_trivial=True)

    @gluon.jit
    def _group_params(z_ptr, s_ptr, stride_sg, k, K, offs_n, mask_n,
                      GROUP_SIZE: gl.constexpr):
        """(-(128 + z), s) of the group of row k (clamped to K - 1) as bf16x2 pairs,
        [BLOCK_N, 1, 1]."""
        g = gl.minimum(k, K - 1) // GROUP_SIZE
        z = gl.load(z_ptr + g * stride_sg + offs_n, mask=mask_n, other=0.0)
        s = gl.load(s_ptr + g * stride_sg + offs_n, mask=mask_n, other=0.0)
        return (as_bf16x2(-(z.to(gl.float32) + 128.0))[:, None, None],
                as_bf16x2(s.to(gl.float32))[:, None, None])

    @gluon.jit
    def _fill_words(w_desc, bar, w_smem, slot, k, n0, pred, BYTES: gl.constexpr,
                    HALVES: gl.constexpr):
        """Expect the slot's bytes on its barrier and start its word boxes (rows k / 8..)."""
        mbarrier.expect(bar, BYTES, pred=pred)
        for h in gl.static_range(HALVES):
            tma_load(w_desc, [k // 8 + h * (_BOX_K // 8), n0], bar,
                     w_smem.index(slot * HALVES + h), pred=pred)

    @gluon.jit
    def _fill_x(x_desc, bar, x_smem, slot, k, m0, m1, pred, HALVES: gl.constexpr):
        """Start the slot's x boxes (columns k..): per tile [BLOCK_M, _BOX_K] one box of
        rows m0.., or two (``x_box_rows``), rows m0.. into its first half and m1.. into
        its second."""
        X_ROWS: gl.constexpr = x_desc.block_shape[0]
        for h in gl.static_range(HALVES):
            tile = x_smem.index(slot * HALVES + h)
            if X_ROWS < tile.shape[0]:
                tma_load(x_desc, [m0, k + h * _BOX_K], bar, tile.slice(0, X_ROWS), pred=pred)
                tma_load(x_desc, [m1, k + h * _BOX_K], bar, tile.slice(X_ROWS, X_ROWS),
                         pred=pred)
            else:
                tma_load(x_desc, [m0, k + h * _BOX_K], bar, tile, pred=pred)

    @gluon.jit
    def _unpack_step(w_smem, slot, nzz, ss, QUAD: gl.constexpr, WORDS: gl.constexpr,
                     A_LAYOUT: gl.constexpr, ORDER: gl.constexpr, HALVES: gl.constexpr):
        """The A operands of a slot's one or two word boxes (the first twice for one)."""
        a0 = _operand(w_smem.index(slot * HALVES), nzz, ss, QUAD, WORDS, A_LAYOUT, ORDER)
        a1 = a0
        if HALVES == 2:
            a1 = _operand(w_smem.index(slot * HALVES + 1), nzz, ss, QUAD, WORDS, A_LAYOUT,
                          ORDER)
        return a0, a1

    @gluon.jit
    def _issue_half(acc, a, x_box):
        """Issue one wgmma (left running): a times the x box [BLOCK_M, _BOX_K], as K x M."""
        return warpgroup_mma(a, x_box.permute((1, 0)), acc, is_async=True)

    @gluon.jit
    def _issue_step(acc, a0, a1, x_smem, slot, HALVES: gl.constexpr):
        """Issue a step's wgmmas (left running) on the slot's x boxes."""
        acc = _issue_half(acc, a0, x_smem.index(slot * HALVES))
        if HALVES == 2:
            acc = _issue_half(acc, a1, x_smem.index(slot * HALVES + 1))
        return acc

    @gluon.jit
    def _retire_step(acc, a0, a1, HALVES: gl.constexpr):
        """Wait for a step's wgmmas; its A tiles stay live (deps) until they retire."""
        if HALVES == 2:
            acc, a0, a1 = warpgroup_mma_wait(num_outstanding=0, deps=[acc, a0, a1])
        else:
            acc, a0 = warpgroup_mma_wait(num_outstanding=0, deps=[acc, a0])
        return acc

    @gluon.jit
    def _refill(w_desc, x_desc, bars, w_smem, x_smem, slot, k, n0, m0, m1, pred,
                BYTES: gl.constexpr, HALVES: gl.constexpr):
        """Refill a slot that every warp has read (its words by loads, x by a retired
        wgmma) with the boxes of rows k..; the barrier and the proxy fence order those
        reads before the TMA's writes."""
        thread_barrier()
        fence_async_shared()
        _fill_words(w_desc, bars.index(slot), w_smem, slot, k, n0, pred, BYTES, HALVES)
        _fill_x(x_desc, bars.index(slot), x_smem, slot, k, m0, m1, pred, HALVES)

    @gluon.jit
    def _release(w_desc, x_desc, bars, empty, w_smem, x_smem, slot, k, n0, m0, m1, pred,
                 BYTES: gl.constexpr, HALVES: gl.constexpr, PRODUCER_WARP: gl.constexpr):
        """A slot every warp has read: handed to the producer warp (its empty mbarrier,
        which one thread arrives on after the barrier; no proxy fence, as CUTLASS's TMA
        pipelines release a stage: the words are unpacked and x's wgmmas retired), or
        refilled here with the boxes of rows k.."""
        if PRODUCER_WARP:
            thread_barrier()
            mbarrier.arrive(empty.index(slot))
        else:
            _refill(w_desc, x_desc, bars, w_smem, x_smem, slot, k, n0, m0, m1, pred, BYTES,
                    HALVES)

    @gluon.jit
    def _produce(w_desc, x_desc, bars, empty, w_smem, x_smem, k_lo, nsteps, n0, m0, m1,
                 BYTES: gl.constexpr, HALVES: gl.constexpr, STAGES: gl.constexpr,
                 BLOCK_K: gl.constexpr, PDL: gl.constexpr):
        """The producer warp: every step's boxes into its slot once the consumers have
        released it (the empty mbarrier's phase (i / STAGES) - 1; a fresh mbarrier
        passes the wait for parity 1 at once). The first slots' words before the wait
        for the kernel before (PDL), x after."""
        for s in gl.static_range(STAGES):
            _fill_words(w_desc, bars.index(s), w_smem, s, k_lo + s * BLOCK_K, n0,
                        s < nsteps, BYTES, HALVES)
        if PDL:
            gdc_wait()
        for s in gl.static_range(STAGES):
            _fill_x(x_desc, bars.index(s), x_smem, s, k_lo + s * BLOCK_K, m0, m1, s < nsteps,
                    HALVES)
        for i in range(STAGES, nsteps):
            slot = i % STAGES
            mbarrier.wait(empty.index(slot), ((i // STAGES) & 1) ^ 1)
            k = k_lo + i * BLOCK_K
            _fill_words(w_desc, bars.index(slot), w_smem, slot, k, n0, True, BYTES, HALVES)
            _fill_x(x_desc, bars.index(slot), x_smem, slot, k, m0, m1, True, HALVES)

    @gluon.jit
    def _consume(w_desc, x_desc, s_ptr, z_ptr, out_ptr, part_ptr, count_ptr, bars, empty,
                 w_smem, x_smem, nzz, ss, nzz1, ss1, offs_n, mask_n, M, N, K, k_lo, nsteps,
                 n0, m0, m1, pid_m, pid_n, pid_k, SPLIT, stride_sg, stride_om,
                 GROUP_SIZE: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                 BLOCK_K: gl.constexpr, HAS_SPLIT: gl.constexpr, NUM_WARPS: gl.constexpr,
                 STAGES: gl.constexpr, PARAMS_AHEAD: gl.constexpr, OVERLAP: gl.constexpr,
                 PDL: gl.constexpr, PDL_TRIGGER: gl.constexpr,
                 LAST_SPLIT_REDUCES: gl.constexpr, LINEAR_PARTIALS: gl.constexpr,
                 PRODUCER_WARP: gl.constexpr):
        """The warpgroup(s): wait for each step's slot, unpack, multiply, release the
        slot; then the split-K sum and the output."""
        HALVES: gl.constexpr = BLOCK_K // _BOX_K
        MMA: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[NUM_WARPS, 1], instr_shape=[16, BLOCK_M, 16])
        A_LAYOUT: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
        A_LINEAR: gl.constexpr = gl.to_linear_layout(A_LAYOUT, [BLOCK_N, _BOX_K])
        ORDER: gl.constexpr = column_order(A_LINEAR, True)
        QUAD: gl.constexpr = _quad_layout(A_LINEAR, ORDER)
        WORDS: gl.constexpr = _words_layout(QUAD)
        BYTES: gl.constexpr = _slot_bytes(BLOCK_K, BLOCK_N, BLOCK_M)
        if PDL and PRODUCER_WARP:
            gdc_wait()  # what the output and the partials overwrite may still be read

        acc = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, MMA)
        if OVERLAP:
            # Step i + 1's unpack runs while step i's wgmmas do; step i's tiles stay live
            # until the wait that retires them (tests/kernels/sm90_build.py checks that no
            # instruction overwrites them in between).
            mbarrier.wait(bars.index(0), 0)
            a0, a1 = _unpack_step(w_smem, 0, nzz, ss, QUAD, WORDS, A_LAYOUT, ORDER, HALVES)
            nzz, ss = nzz1, ss1
            nzz1, ss1 = _group_params(z_ptr, s_ptr, stride_sg, k_lo + 2 * BLOCK_K, K, offs_n,
                                      mask_n, GROUP_SIZE)
            for i in range(nsteps):
                slot = i % STAGES
                acc = _issue_step(acc, a0, a1, x_smem, slot, HALVES)
                j = gl.minimum(i + 1, nsteps - 1)  # past the last step: that one again
                mbarrier.wait(bars.index(j % STAGES), (j // STAGES) & 1)
                b0, b1 = _unpack_step(w_smem, j % STAGES, nzz, ss, QUAD, WORDS, A_LAYOUT,
                                      ORDER, HALVES)
                nzz, ss = nzz1, ss1
                nzz1, ss1 = _group_params(z_ptr, s_ptr, stride_sg, k_lo + (i + 3) * BLOCK_K,
                                          K, offs_n, mask_n, GROUP_SIZE)
                acc = _retire_step(acc, a0, a1, HALVES)
                _release(w_desc, x_desc, bars, empty, w_smem, x_smem, slot,
                         k_lo + (i + STAGES) * BLOCK_K, n0, m0, m1, i + STAGES < nsteps, BYTES,
                         HALVES, PRODUCER_WARP)
                a0, a1 = b0, b1
        else:
            for i in range(nsteps):
                slot = i % STAGES
                mbarrier.wait(bars.index(slot), (i // STAGES) & 1)
                nzz_next, ss_next = _group_params(z_ptr, s_ptr, stride_sg,
                                                  k_lo + (i + PARAMS_AHEAD) * BLOCK_K, K,
                                                  offs_n, mask_n, GROUP_SIZE)
                # The second half's unpack runs while the first half's wgmma does.
                a0 = _operand(w_smem.index(slot * HALVES), nzz, ss, QUAD, WORDS, A_LAYOUT,
                              ORDER)
                acc = _issue_half(acc, a0, x_smem.index(slot * HALVES))
                a1 = a0
                if HALVES == 2:
                    a1 = _operand(w_smem.index(slot * HALVES + 1), nzz, ss, QUAD, WORDS,
                                  A_LAYOUT, ORDER)
                    acc = _issue_half(acc, a1, x_smem.index(slot * HALVES + 1))
                acc = _retire_step(acc, a0, a1, HALVES)
                if PARAMS_AHEAD == 2:
                    nzz, ss, nzz1, ss1 = nzz1, ss1, nzz_next, ss_next
                else:
                    nzz, ss = nzz_next, ss_next
                _release(w_desc, x_desc, bars, empty, w_smem, x_smem, slot,
                         k_lo + (i + STAGES) * BLOCK_K, n0, m0, m1, i + STAGES < nsteps, BYTES,
                         HALVES, PRODUCER_WARP)
        if PDL_TRIGGER == 2:
            gdc_launch_dependents()

        offs_cn = n0 + physical_columns(
            gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, MMA)), ORDER)
        offs_cm, own_rows = _tile_rows(m0, m1, pid_m, M, x_desc.block_shape[0], BLOCK_M,
                                       gl.SliceLayout(0, MMA))
        store_out_t(acc, out_ptr, part_ptr, count_ptr, offs_cm, offs_cn,
                    own_rows[None, :] & (offs_cn < N)[:, None], stride_om, M, N,
                    pid_m, pid_n, pid_k, SPLIT, HAS_SPLIT, LAST_SPLIT_REDUCES,
                    LINEAR_PARTIALS, NUM_WARPS)

    @gluon.jit
    def _tile_rows(m0, m1, pid_m, M, X_ROWS: gl.constexpr, BLOCK_M: gl.constexpr,
                   LAYOUT: gl.constexpr):
        """(the row of x of each tile row, whether the program stores it): rows m0.. of
        one box, or with two boxes (``x_box_rows``) m0.. then m1.., the second box's rows
        that the first holds not stored; nor the rows of the block before (the last
        block overlapping it, ``_first_x_row``), nor rows from M on."""
        j = gl.arange(0, BLOCK_M, layout=LAYOUT)
        if X_ROWS < BLOCK_M:
            rows = gl.where(j < X_ROWS, m0 + j, m1 + j - X_ROWS)
            own = (j < X_ROWS) | (rows >= m0 + X_ROWS)
        else:
            rows = m0 + j
            own = rows >= pid_m * BLOCK_M
        return rows, own & (rows < M)

    @gluon.jit
    def _first_x_row(pid_m, M, BLOCK_M: gl.constexpr):
        """The row of x where row block pid_m's tile starts: pid_m * BLOCK_M, except that
        the last block of several starts BLOCK_M rows before M, overlapping the block
        before (whose rows it then does not store), so that its x boxes read at most the
        15 rows past x that ``launched_rows`` adds (zeros from the TMA), not up to 63.
        Boxes mostly past x make every step slower (against the last block at
        pid_m * BLOCK_M: 14336 x 4096 at 65 rows 38.2 against 51.2 us)."""
        first = pid_m * BLOCK_M
        if M > BLOCK_M:
            first = gl.minimum(first, M - BLOCK_M)
        return first

    @gluon.jit
    def _w4_wgmma_tma_kernel(
        x_desc, w_desc, s_ptr, z_ptr, out_ptr, part_ptr, count_ptr,
        M, N, K, K_SPLIT, SPLIT, stride_sg, stride_om,
        GROUP_SIZE: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
        BLOCK_K: gl.constexpr, HAS_SPLIT: gl.constexpr, NUM_WARPS: gl.constexpr,
        STAGES: gl.constexpr, PARAMS_AHEAD: gl.constexpr, OVERLAP: gl.constexpr,
        PDL: gl.constexpr, PDL_TRIGGER: gl.constexpr, LAST_SPLIT_REDUCES: gl.constexpr,
        LINEAR_PARTIALS: gl.constexpr = False, PRODUCER_WARP: gl.constexpr = False,
    ):
        if PDL_TRIGGER == 1:
            gdc_launch_dependents()
        HALVES: gl.constexpr = BLOCK_K // _BOX_K
        MMA: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[NUM_WARPS, 1], instr_shape=[16, BLOCK_M, 16])
        A_LINEAR: gl.constexpr = gl.to_linear_layout(
            gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2), [BLOCK_N, _BOX_K])
        PARAMS: gl.constexpr = gl.SliceLayout(
            1, gl.SliceLayout(2, _quad_layout(A_LINEAR, column_order(A_LINEAR, True))))
        BYTES: gl.constexpr = _slot_bytes(BLOCK_K, BLOCK_N, BLOCK_M)

        pid_n = gl.program_id(0)
        pid_k = gl.program_id(1)
        pid_m = gl.program_id(2)
        k_lo = pid_k * K_SPLIT
        nsteps = (gl.minimum(k_lo + K_SPLIT, K) - k_lo + BLOCK_K - 1) // BLOCK_K
        n0 = pid_n * BLOCK_N
        m0 = _first_x_row(pid_m, M, BLOCK_M)
        m1 = M - x_desc.block_shape[0]  # the second box's first row (one block, two boxes)

        w_smem = gl.allocate_shared_memory(gl.int32, [STAGES * HALVES, _BOX_K // 8, BLOCK_N],
                                           w_desc.layout)
        x_smem = gl.allocate_shared_memory(gl.bfloat16, [STAGES * HALVES, BLOCK_M, _BOX_K],
                                           x_desc.layout)
        bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        # the slots' release to the producer warp (a separate allocation: the barrier
        # analysis then sees no conflict between a release and the next step's wait)
        empty = gl.allocate_shared_memory(gl.int64, [STAGES if PRODUCER_WARP else 1, 1],
                                          mbarrier.MBarrierLayout())
        for s in gl.static_range(STAGES):
            mbarrier.init(bars.index(s), count=1)
            if PRODUCER_WARP:
                mbarrier.init(empty.index(s), count=1)
        fence_async_shared()
        thread_barrier()

        # Word boxes and group parameters before the wait for the kernel before (PDL);
        # x, which that kernel writes, after it.
        if not PRODUCER_WARP:
            for s in gl.static_range(STAGES):
                _fill_words(w_desc, bars.index(s), w_smem, s, k_lo + s * BLOCK_K, n0,
                            s < nsteps, BYTES, HALVES)
        offs_n = n0 + gl.arange(0, BLOCK_N, layout=PARAMS)  # physical columns, as the words
        mask_n = offs_n < N
        nzz, ss = _group_params(z_ptr, s_ptr, stride_sg, k_lo, K, offs_n, mask_n, GROUP_SIZE)
        nzz1, ss1 = nzz, ss
        if PARAMS_AHEAD == 2 or OVERLAP:
            nzz1, ss1 = _group_params(z_ptr, s_ptr, stride_sg, k_lo + BLOCK_K, K, offs_n,
                                      mask_n, GROUP_SIZE)
        if PRODUCER_WARP:
            gl.warp_specialize(
                [(_consume, (w_desc, x_desc, s_ptr, z_ptr, out_ptr, part_ptr, count_ptr, bars,
                             empty, w_smem, x_smem, nzz, ss, nzz1, ss1, offs_n, mask_n, M, N,
                             K, k_lo, nsteps, n0, m0, m1, pid_m, pid_n, pid_k, SPLIT, stride_sg,
                             stride_om, GROUP_SIZE, BLOCK_M, BLOCK_N, BLOCK_K, HAS_SPLIT,
                             NUM_WARPS, STAGES, PARAMS_AHEAD, OVERLAP, PDL, PDL_TRIGGER,
                             LAST_SPLIT_REDUCES, LINEAR_PARTIALS, PRODUCER_WARP)),
                 (_produce, (w_desc, x_desc, bars, empty, w_smem, x_smem, k_lo, nsteps, n0,
                             m0, m1, BYTES, HALVES, STAGES, BLOCK_K, PDL))],
                [1], [_PRODUCER_REGISTERS])
        else:
            if PDL:
                gdc_wait()
            for s in gl.static_range(STAGES):
                _fill_x(x_desc, bars.index(s), x_smem, s, k_lo + s * BLOCK_K, m0, m1, s < nsteps,
                        HALVES)
            _consume(w_desc, x_desc, s_ptr, z_ptr, out_ptr, part_ptr, count_ptr, bars, empty,
                     w_smem, x_smem, nzz, ss, nzz1, ss1, offs_n, mask_n, M, N, K, k_lo,
                     nsteps, n0, m0, m1, pid_m, pid_n, pid_k, SPLIT, stride_sg, stride_om,
                     GROUP_SIZE, BLOCK_M, BLOCK_N, BLOCK_K, HAS_SPLIT, NUM_WARPS, STAGES,
                     PARAMS_AHEAD, OVERLAP, PDL, PDL_TRIGGER, LAST_SPLIT_REDUCES,
                     LINEAR_PARTIALS, PRODUCER_WARP)
        for s in gl.static_range(STAGES):
            mbarrier.invalidate(bars.index(s))
            if PRODUCER_WARP:
                mbarrier.invalidate(empty.index(s))


def tma_constexprs(config: TmaConfig, block_m: int, group_size: int, splits: int, *,
                   pdl_wait: bool = False, pdl_trigger: int = 0) -> dict:
    """The compile-time arguments of ``_w4_wgmma_tma_kernel`` (shared with the sm_90
    build tests, so that they build what runs)."""
    return dict(GROUP_SIZE=group_size, BLOCK_M=block_m, BLOCK_N=config.block_n,
                BLOCK_K=config.block_k, HAS_SPLIT=splits > 1, NUM_WARPS=config.num_warps,
                STAGES=config.stages, PARAMS_AHEAD=config.params_ahead,
                OVERLAP=config.overlap, PDL=pdl_wait,
                PDL_TRIGGER=pdl_trigger,
                LAST_SPLIT_REDUCES=last_split_constexpr(config.last_split_reduces, splits),
                LINEAR_PARTIALS=linear_partials_constexpr(
                    config.linear_partials, config.last_split_reduces, splits),
                PRODUCER_WARP=config.producer_warp)


def descriptors(x: torch.Tensor, packed: torch.Tensor, config: TmaConfig, block_m: int):
    """The TMA descriptors of x's boxes [``x_box_rows``, 64] (128-byte swizzle: the
    wgmma's B operand as it lands) and of the word boxes [8, block_n] (no swizzle), one
    of each per 64 rows of K."""
    x_layout, w_layout = _box_layouts()
    box_rows = x_box_rows(x.shape[0], block_m, config.num_warps)
    return (TensorDescriptor.from_tensor(x, [box_rows, X_BOX_K], x_layout),
            TensorDescriptor.from_tensor(packed, [X_BOX_K // 8, config.block_n], w_layout))


@functools.cache
def _box_layouts():
    """(x's, the words') shared layouts, built once: each costs about 8 us of host time,
    which an eager call would otherwise pay twice."""
    return (gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2),
            gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2))


def w4a16_gemm_wgmma_tma(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor,
                         zeros: torch.Tensor, group_size: int,
                         config: TmaConfig | None = None) -> torch.Tensor:
    """``w4a16_gemm_ref`` for x [M, K] bf16 (M <= ``TMA_MAX_M``) on a Hopper GPU,
    the weight in ``mma_pack``'s layout (integer zero points in [0, 16])."""
    if gluon is None:
        raise RuntimeError("w4a16_gemm_wgmma_tma needs triton with Gluon")
    m, k = x.shape
    n = packed.shape[1]
    if x.dtype != torch.bfloat16 or not tma_supported(m, n, k, group_size):
        raise ValueError(f"TMA wgmma path takes bf16 x with 1..{TMA_MAX_M} rows, K % 64 == 0, "
                         f"N % 4 == 0 and 64-row groups; got M={m}, N={n}, K={k}, group "
                         f"{group_size}, {x.dtype}")
    x = x.contiguous()
    if x.data_ptr() % 16:
        x = x.clone()  # TMA reads from 16-byte aligned rows
    config = config or pick_tma_config(m, n, k, group_size, sm_count(x))
    block_m = config.block_m or tma_block_m(m)
    if block_m not in (8, 16, 32, 64, 128):
        raise ValueError(f"TmaConfig takes block_m 8, 16, 32, 64 or 128; got {block_m}")
    if group_size < k and group_size % config.block_k:
        raise ValueError(f"block_k {config.block_k} does not divide the group size {group_size}")
    if (config.block_k not in (64, 128) or config.num_warps not in (4, 8)
            or config.block_n % (16 * config.num_warps)):
        raise ValueError(f"TmaConfig takes block_k 64 or 128 and 4 or 8 warps of 16-column "
                         f"multiples; got {config}")
    if config.producer_warp and config.num_warps != 4:
        raise ValueError(f"TmaConfig takes producer_warp with 4 warps; got {config}")
    if config.params_ahead not in (1, 2):
        raise ValueError(f"TmaConfig takes params_ahead 1 or 2; got {config.params_ahead}")
    if shared_bytes(config, block_m) > SHARED_BYTES:
        raise ValueError(f"{config.stages} stages need {shared_bytes(config, block_m)} bytes of "
                         f"shared memory (at most {SHARED_BYTES}): fewer stages")
    splits, k_split = even_split(k, config.block_k, config.split_k)
    blocks = -(-n // config.block_n)
    m_blocks = -(-m // block_m)
    rows = launched_rows(m)
    out = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    constexprs = tma_constexprs(config, block_m, min(group_size, k), splits,
                                pdl_wait=pdl.launch(x.device),
                                pdl_trigger=pdl.trigger(x.device, m))
    partials, counters = split_buffers(
        out, splits, partial_shape(constexprs["LINEAR_PARTIALS"], blocks * m_blocks,
                                   config.block_n * block_m, rows, n), blocks * m_blocks)
    x_desc, w_desc = descriptors(x, packed, config, block_m)
    _w4_wgmma_tma_kernel[(blocks, splits, m_blocks)](
        x_desc, w_desc, scales, zeros, out, partials, counters,
        rows, n, k, k_split, splits, scales.stride(0), out.stride(0), **constexprs,
        launch_pdl=pdl.launch(x.device), **compile_options(config),
    )
    return out[:m]


def compile_options(config: TmaConfig) -> dict:
    """The compiler's options of a launch (shared with the sm_90 build tests)."""
    options = {"num_warps": config.num_warps}
    if config.maxnreg or config.producer_warp:
        options["maxnreg"] = config.maxnreg or PRODUCER_WARP_MAXNREG
    return options
