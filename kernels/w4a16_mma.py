"""W4A16 GEMM on tensor cores with the weight dequantized straight into MMA registers
(Gluon, NVIDIA sm_80+), for decode and small batches (M <= ``MMA_MAX_M``).

Why a second layout. The tl.dot kernel of ``tamis.kernels.w4a16`` unpacks a tile in
whatever register layout Triton picks for the load, and Triton then moves it through
shared memory into the layout the tensor core wants. Here each thread's loaded words
already hold exactly the codes of its ``mma.sync`` fragments (Marlin's idea), and Gluon's
explicit layouts prove at compile time that no data moves
(``convert_layout(..., assert_trivial=True)``).

Orientation: out^T = W^T x^T. The weight is the MMA's A operand (m16: 16 output columns)
and x^T its B operand (n8: 8 rows of x), so decode at M <= 8 pads x to 8 rows, not 16.

Stored layout (``mma_pack``): the canonical words (code j of word r is row 8r + j) with
each word's nibbles interleaved as AWQ does, codes 0, 2, 4, 6, 1, 3, 5, 7 at nibbles
0..7. Inside the kernel, K is visited in a permuted order (free: a dot product does not
care): per 32-row block, logical row k' is physical row ``pi(k')``, with k' bits 0, 3, 4 ->
physical bits 0, 1, 2 and k' bits 1, 2 -> physical bits 3, 4. An m16n8k16 MMA thread holds
logical rows 2c, 2c + 1, 2c + 8, 2c + 9 of its k16 steps (c = lane % 4), so over a 32-row
block it holds the 8 physically contiguous rows 8c .. 8c + 7: one word of weights (read
with one shift per code pair) and one 16-byte load of x. Output columns are permuted
too (``column_order``): the columns a thread holds in registers are adjacent in memory,
so its words of one row load as one vector of up to 16 bytes, and each result is stored
at its physical column.

Per word, one inline-PTX block (``tamis.kernels.w4a16_fragments._UNPACK``)::

    v_j = lop3(word >> 4j, 0x000F000F, 0x43004300)   # bf16x2 (128 + q_j, 128 + q_{j+4})
    v_j = fma(v_j, 1, -(128 + z))                      # (q_j - z, q_{j+4} - z), exact

(integer zero points: ``q - z`` is an integer of at most 5 bits, exact in bf16). On deep
layers at one row (``MmaConfig.zeros_by_x_sums``) the FMA goes: the MMA takes 128 + q
as it is and (128 + z) times the step's sum of x comes off its fp32 product
(``_step_by_sums``; sums of x once per program, ``_x_step_sums``). The MMA
multiplies that tile by x^T in fp32 (the tile's rows of x past M repeat row M - 1: their
output columns are never stored), and the group scale
multiplies each step's product per output column in fp32: every step lies inside one
group. K is split over programs; the last program of a tile reduces the splits
(``tamis.kernels.splitk``). Knobs (``MmaConfig``): words of 1 or 2 steps load together
(more bytes in flight per thread); at one row the MMA's columns of x can carry chunks of
K instead of padding rows (``k_chunks``), so that a program sums its share of K without
split K's global partials.

Needs: CUDA, Gluon (triton >= 3.5), bf16 x, 4-bit codes, K % 32 == 0, integer zero
points in [0, 16], groups a multiple of 32 rows or the whole K (``mma_supported``,
``mma_layout_supported``).
"""
from __future__ import annotations

import torch

from tamis.kernels import pdl
from tamis.kernels.splitk import even_split, last_split_constexpr, sm_count, split_buffers
from tamis.kernels.w4a16_common import (code_shifts, integer_zero_points,
                                        tensor_core_weight_supported)
from tamis.kernels.w4a16_mma_tiles import (MmaConfig, chunk_rows, chunks_not_whole,
                                           chunks_of_four_steps, pick_mma_config, runs_paired,
                                           tile_rows, whole_wave_programs)

from tamis.kernels._gluon import gluon

if gluon is not None:
    from triton.experimental.gluon.language.nvidia.ampere import mma_v2

    from tamis.kernels._gluon import (gdc_launch_dependents, gdc_wait, gl, rows_view,
                                      thread_barrier)
    from tamis.kernels.w4a16_fragments import (bf16_halves, column_order, constexpr_min,
                                               logical_columns, logical_x,
                                               physical_columns, plain_order, store_out_t,
                                               unpack_tile, unpack_tile_offset,
                                               word_layout, x_tile_layout, x_word_layout)

MMA_MAX_M = 64


def mma_layout_supported(k: int, group_size: int, bits: int, zeros: torch.Tensor) -> bool:
    """Whether a layer's weight can take this kernel's layout: a tensor-core weight shape
    (``tensor_core_weight_supported``) and integer zero points in [0, 16]."""
    return tensor_core_weight_supported(k, group_size, bits) and integer_zero_points(zeros)


def mma_supported(x: torch.Tensor, k: int, group_size: int, bits: int) -> bool:
    """A call the kernel takes: bf16 x with at most MMA_MAX_M rows on a weight of
    ``tensor_core_weight_supported`` shape (zero points are checked once, by
    ``mma_layout_supported``)."""
    return (x.dtype == torch.bfloat16 and x.shape[0] <= MMA_MAX_M
            and tensor_core_weight_supported(k, group_size, bits))


def mma_pack(qweight: torch.Tensor, k: int) -> torch.Tensor:
    """The canonical words (``tamis.kernels.w4a16``: code j of word r is row 8r + j) in
    the stored layout of this kernel (``code_shifts(4, interleaved=True)``). K must be a
    multiple of 32."""
    if k % 32 or qweight.shape[0] * 8 != k:
        raise ValueError(f"mma_pack needs K % 32 == 0 and K / 8 word rows; got K={k}, "
                         f"{qweight.shape[0]} rows")
    packed = torch.zeros_like(qweight)
    for code, shift in enumerate(code_shifts(4, interleaved=True)):
        packed |= ((qweight >> (4 * code)) & 0xF) << shift
    return packed


def mma_unpack(packed: torch.Tensor, k: int) -> torch.Tensor:
    """The codes [K, N] (int32) of words in this kernel's stored layout."""
    shifts = torch.tensor(code_shifts(4, interleaved=True), dtype=torch.int32,
                          device=packed.device)
    codes = (packed.unsqueeze(1) >> shifts[None, :, None]) & 0xF       # [K/8, 8, N]
    return codes.reshape(k, -1)


if gluon is not None:

    @gluon.jit
    def _group_params(z_ptr, s_ptr, stride_sg, k, K, offs_wn, mask_wn, offs_cn,
                      GROUP_SIZE: gl.constexpr, ORDER: gl.constexpr,
                      BY_SUMS: gl.constexpr = False):
        """(-(128 + z) as bf16x2 per word column, s per output column) of the group of
        row k (clamped to K - 1); with BY_SUMS (128 + z in fp32 per output column, s).
        Both load in the word layout, one vector a thread with ``vector_columns`` (loaded
        by output column the compiler cannot tell the columns of a thread are adjacent:
        one 16-bit load each)."""
        g = _group_of(gl.minimum(k, K - 1), GROUP_SIZE)
        z = gl.load(z_ptr + g * stride_sg + offs_wn, mask=mask_wn, other=0.0)
        s = gl.load(s_ptr + g * stride_sg + offs_wn, mask=mask_wn, other=0.0)
        if BY_SUMS:
            zp = _by_logical_column(z, ORDER, offs_cn).to(gl.float32) + 128.0
        else:
            zp = _negated_offset_zero(z)
        return zp, _by_logical_column(s, ORDER, offs_cn)

    @gluon.jit
    def _by_logical_column(v, ORDER: gl.constexpr, like):
        """Per-column values (scales, zero points) loaded by physical column (in the word
        layout, as one vector a thread) -> by logical column in ``like``'s layout (the
        accumulator's columns): the same thread holds both, so no data moves."""
        BN: gl.constexpr = v.shape[0]
        t = gl.reshape(logical_columns(gl.reshape(v, [BN, 1]), ORDER), [BN])
        return gl.convert_layout(t, like.type.layout, assert_trivial=True)

    @gluon.jit
    def _group_of(k, GROUP_SIZE: gl.constexpr):
        """The group of row k >= 0 (a shift for power-of-two groups: k // GROUP_SIZE on a
        signed k costs three instructions)."""
        if GROUP_SIZE & (GROUP_SIZE - 1) == 0:
            return k >> _log2(GROUP_SIZE)
        return k // GROUP_SIZE

    @gluon.constexpr_function
    def _log2(n):
        return n.bit_length() - 1

    @gluon.jit
    def _negated_offset_zero(z):
        """-(128 + z) as bf16, twice in an int32, for integer zero points z in [0, 16]
        (``mma_layout_supported``), without float conversions: 1024 + z in fp16 has z in
        its low mantissa bits, and bf16 -(128 + z) is 0xC300 | z."""
        z_bits = (z.to(gl.float16) + 1024.0).to(gl.int16, bitcast=True).to(gl.int32)
        negated = (z_bits & 0xFF) | 0xC300
        return negated | (negated << 16)

    @gluon.jit
    def _step_with(acc, words, x, nzz, s, A_LAYOUT: gl.constexpr, B_LAYOUT: gl.constexpr,
                   ORDER: gl.constexpr):
        """acc + the product of one step whose group parameters (``_group_params``) are
        loaded."""
        w = unpack_tile(words, nzz[:, None], A_LAYOUT, ORDER)
        return acc + mma_v2(w, _x_operand(x, B_LAYOUT),
                            gl.zeros_like(acc)) * s.to(gl.float32)[:, None]

    @gluon.jit
    def _x_operand(x, B_LAYOUT: gl.constexpr):
        """The MMA's B operand from a loaded x^T tile (physical row order), bf16 or
        bf16 pairs (``_load_x_words``)."""
        if x.dtype == gl.int32:
            x = _x_from_words(x, x_tile_layout(gl.to_linear_layout(B_LAYOUT, [2 * x.shape[0],
                                                                          x.shape[1]])))
        return logical_x(x, B_LAYOUT)

    @gluon.jit
    def _step_by_sums(acc, words, x, zc, s, x_sum, A_LAYOUT: gl.constexpr,
                      B_LAYOUT: gl.constexpr, ORDER: gl.constexpr):
        """``_step_with`` for codes unpacked as 128 + q: the MMA's sum over the step's rows
        is sum((q - z) x) + (128 + z) sum(x), so (128 + z) times ``x_sum`` (the step's
        sum of x per row of x) comes off it in fp32 before the scale. Exact products,
        fp32 sums: the same result within fp32 rounding of terms ~30x larger than the
        sum kept."""
        w = unpack_tile_offset(words, A_LAYOUT, ORDER)
        product = (mma_v2(w, _x_operand(x, B_LAYOUT), gl.zeros_like(acc))
                   - zc[:, None] * x_sum[None, :])
        return acc + product * s.to(gl.float32)[:, None]

    @gluon.jit
    def _paired_step(acc, words, x, zp, s, x_sums, step, BY_SUMS: gl.constexpr,
                     A_LAYOUT: gl.constexpr, B_LAYOUT: gl.constexpr, ORDER: gl.constexpr):
        """One step of the paired loop (step: its index in the program's split), by
        ``_step_by_sums`` (BY_SUMS: zp = 128 + z, x_sums from ``_x_step_sums``) or
        ``_step_with`` (zp = -(128 + z) as bf16x2)."""
        if BY_SUMS:
            x_sum = x_sums.index(step).load(gl.SliceLayout(0, acc.type.layout))
            acc = _step_by_sums(acc, words, x, zp, s, x_sum, A_LAYOUT, B_LAYOUT, ORDER)
        else:
            acc = _step_with(acc, words, x, zp, s, A_LAYOUT, B_LAYOUT, ORDER)
        return acc

    @gluon.jit
    def _four_steps_up_front(acc, words0, x0, zp0, s0, x_sums, w_ptrs, x_ptrs, z_ptr, s_ptr,
                             k_lo, stride_qk, stride_sg, offs_wr, mask_wn, offs_zn, mask_zn,
                             offs_cn, offs_xk, K, STEP_K: gl.constexpr,
                             GROUP_SIZE: gl.constexpr, EVEN: gl.constexpr,
                             ORDER: gl.constexpr, BY_SUMS: gl.constexpr,
                             A_LAYOUT: gl.constexpr, B_LAYOUT: gl.constexpr):
        """The 4 steps from k_lo (``MmaConfig.steps_up_front``): step 0's load given
        (words0, x0, zp0, s0), steps 1-3 loaded first, each into its own registers, so
        that no load waits for an MMA to free the registers it fills."""
        words1, zp1, s1, x1 = _load_step(
            w_ptrs, x_ptrs, z_ptr, s_ptr, k_lo + STEP_K, stride_qk, stride_sg, offs_wr,
            mask_wn, offs_zn, mask_zn, offs_cn, offs_xk, K, GROUP_SIZE, EVEN, ORDER, BY_SUMS)
        words2, zp2, s2, x2 = _load_step(
            w_ptrs, x_ptrs, z_ptr, s_ptr, k_lo + 2 * STEP_K, stride_qk, stride_sg, offs_wr,
            mask_wn, offs_zn, mask_zn, offs_cn, offs_xk, K, GROUP_SIZE, EVEN, ORDER, BY_SUMS)
        words3, zp3, s3, x3 = _load_step(
            w_ptrs, x_ptrs, z_ptr, s_ptr, k_lo + 3 * STEP_K, stride_qk, stride_sg, offs_wr,
            mask_wn, offs_zn, mask_zn, offs_cn, offs_xk, K, GROUP_SIZE, EVEN, ORDER, BY_SUMS)
        return _four_steps(acc, words0, x0, zp0, s0, words1, x1, zp1, s1, words2, x2, zp2, s2,
                           words3, x3, zp3, s3, x_sums, BY_SUMS, A_LAYOUT, B_LAYOUT, ORDER)

    @gluon.jit
    def _four_steps(acc, words0, x0, zp0, s0, words1, x1, zp1, s1, words2, x2, zp2, s2,
                    words3, x3, zp3, s3, x_sums, BY_SUMS: gl.constexpr,
                    A_LAYOUT: gl.constexpr, B_LAYOUT: gl.constexpr, ORDER: gl.constexpr):
        """acc + steps 0-3 of ``steps_up_front``'s chunk, every load given, in order."""
        acc = _paired_step(acc, words0, x0, zp0, s0, x_sums, 0, BY_SUMS, A_LAYOUT, B_LAYOUT,
                           ORDER)
        acc = _paired_step(acc, words1, x1, zp1, s1, x_sums, 1, BY_SUMS, A_LAYOUT, B_LAYOUT,
                           ORDER)
        acc = _paired_step(acc, words2, x2, zp2, s2, x_sums, 2, BY_SUMS, A_LAYOUT, B_LAYOUT,
                           ORDER)
        return _paired_step(acc, words3, x3, zp3, s3, x_sums, 3, BY_SUMS, A_LAYOUT,
                            B_LAYOUT, ORDER)

    @gluon.jit
    def _x_step_sums(x_ptr, stride_xm, k_lo, k_hi, row0, M, STEP_K: gl.constexpr,
                     STEPS: gl.constexpr, BLOCK_M: gl.constexpr, X_ROWS: gl.constexpr,
                     NUM_WARPS: gl.constexpr):
        """Shared memory [STEPS, BLOCK_M] fp32 holding at [i, n] the sum of x row
        min(row0 + n, M - 1) over rows k_lo + i STEP_K .. of K (below k_hi): what
        ``_step_by_sums`` multiplies by 128 + z in step i. Columns from X_ROWS - 1 on
        share one row of x (X_ROWS = min(M, BLOCK_M): at M = 1 one row is summed)."""
        TPW_K: gl.constexpr = constexpr_min(STEP_K // 8, 32)
        L: gl.constexpr = gl.BlockedLayout([1, 8], [32 // TPW_K, TPW_K], [NUM_WARPS, 1],
                                           [1, 0])
        offs_s = gl.arange(0, STEPS, layout=gl.SliceLayout(1, L))
        rows = (k_lo + offs_s[:, None] * STEP_K
                + gl.arange(0, STEP_K, layout=gl.SliceLayout(0, L))[None, :])
        cols = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, L))
        sums = gl.zeros([STEPS, BLOCK_M], gl.float32, L)
        for r in gl.static_range(X_ROWS):
            xr = gl.load(x_ptr + gl.minimum(row0 + r, M - 1) * stride_xm + rows,
                         mask=rows < k_hi, other=0.0)
            total = gl.sum(xr.to(gl.float32), axis=1)
            if r == X_ROWS - 1:
                sums = gl.where((cols >= r)[None, :], total[:, None], sums)
            else:
                sums = gl.where((cols == r)[None, :], total[:, None], sums)
        smem = gl.allocate_shared_memory(gl.float32, [STEPS, BLOCK_M],
                                         gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0]))
        smem.store(sums)
        thread_barrier()
        return rows_view(smem)

    @gluon.jit
    def _step(acc, words, x, k, z_ptr, s_ptr, stride_sg, offs_wn, mask_wn, offs_cn,
              K, GROUP_SIZE: gl.constexpr, A_LAYOUT: gl.constexpr, B_LAYOUT: gl.constexpr,
              ORDER: gl.constexpr):
        """acc + the product of one step (rows k.. of K, inside one group; past K, x reads
        as 0 and the last group's scale stands in)."""
        nzz, s = _group_params(z_ptr, s_ptr, stride_sg, k, K, offs_wn, mask_wn, offs_cn,
                               GROUP_SIZE, ORDER)
        return _step_with(acc, words, x, nzz, s, A_LAYOUT, B_LAYOUT, ORDER)

    @gluon.jit
    def _two_steps(acc, words, x, k, z_ptr, s_ptr, stride_sg, offs_wn, mask_wn, offs_cn,
                   K, GROUP_SIZE: gl.constexpr, A_LAYOUT: gl.constexpr,
                   B_LAYOUT: gl.constexpr, ORDER: gl.constexpr, WL: gl.constexpr,
                   XL: gl.constexpr):
        """``_step`` over the two halves of a load of two steps."""
        words_a, words_b = _halves(words, 1, WL)
        x_a, x_b = _halves(x, 0, XL)
        acc = _step(acc, words_a, x_a, k, z_ptr, s_ptr, stride_sg, offs_wn, mask_wn,
                    offs_cn, K, GROUP_SIZE, A_LAYOUT, B_LAYOUT, ORDER)
        return _step(acc, words_b, x_b, k + x_a.shape[0], z_ptr, s_ptr, stride_sg, offs_wn,
                     mask_wn, offs_cn, K, GROUP_SIZE, A_LAYOUT, B_LAYOUT, ORDER)

    @gluon.jit
    def _two_steps_with(acc, words, x, nzz, s, nzz2, s2, A_LAYOUT: gl.constexpr,
                        B_LAYOUT: gl.constexpr, ORDER: gl.constexpr, WL: gl.constexpr,
                        XL: gl.constexpr):
        """``_step_with`` over the two halves of a load of two steps, the groups'
        parameters of both loaded ((nzz, s) the first step's, (nzz2, s2) the second's)."""
        words_a, words_b = _halves(words, 1, WL)
        x_a, x_b = _halves(x, 0, XL)
        acc = _step_with(acc, words_a, x_a, nzz, s, A_LAYOUT, B_LAYOUT, ORDER)
        return _step_with(acc, words_b, x_b, nzz2, s2, A_LAYOUT, B_LAYOUT, ORDER)

    @gluon.jit
    def _step_params(w_ptrs, z_ptr, s_ptr, k, stride_qk, stride_sg, offs_wr, mask_wn,
                     offs_zn, mask_zn, offs_cn, K, GROUP_SIZE: gl.constexpr,
                     EVEN: gl.constexpr, ORDER: gl.constexpr, BY_SUMS: gl.constexpr):
        """(words, zero points (``_group_params``), s) of the one-step load at row k of K:
        ``_load_step`` without x."""
        words = _load_words(w_ptrs, (k >> 3) * stride_qk, (k >> 3) + offs_wr, mask_wn, K, EVEN)
        zp, s = _group_params(z_ptr, s_ptr, stride_sg, k, K, offs_zn, mask_zn, offs_cn,
                              GROUP_SIZE, ORDER, BY_SUMS)
        return words, zp, s

    @gluon.jit
    def _load_step(w_ptrs, x_ptrs, z_ptr, s_ptr, k, stride_qk, stride_sg, offs_wr, mask_wn,
                   offs_zn, mask_zn, offs_cn, offs_xk, K,
                   GROUP_SIZE: gl.constexpr, EVEN: gl.constexpr, ORDER: gl.constexpr,
                   BY_SUMS: gl.constexpr):
        """(words, zero points (``_group_params``), s, x^T as bf16 pairs) of the one-step
        load at row k of K: ``_step_params`` and x."""
        words, zp, s = _step_params(w_ptrs, z_ptr, s_ptr, k, stride_qk, stride_sg, offs_wr,
                                    mask_wn, offs_zn, mask_zn, offs_cn, K, GROUP_SIZE, EVEN,
                                    ORDER, BY_SUMS)
        return words, zp, s, _load_x_words(x_ptrs, k, offs_xk, K, EVEN)

    @gluon.jit
    def _halves(t, DIM: gl.constexpr, LAYOUT: gl.constexpr):
        """The two halves of a 2-D tile along DIM (those bits of DIM are registers: no
        data moves), each in LAYOUT."""
        if DIM == 0:
            u = gl.permute(gl.reshape(t, [2, t.shape[0] // 2, t.shape[1]]), [1, 2, 0])
        else:
            u = gl.permute(gl.reshape(t, [t.shape[0], 2, t.shape[1] // 2]), [0, 2, 1])
        a, b = gl.split(u)
        return (gl.convert_layout(a, LAYOUT, assert_trivial=True),
                gl.convert_layout(b, LAYOUT, assert_trivial=True))

    @gluon.jit
    def _chunked_operands(qw_ptr, pid_n, N, k_chunk, stride_qk, stride_sg, offs_wr,
                          COLS: gl.constexpr, BLOCK_N: gl.constexpr, GROUP_SIZE: gl.constexpr,
                          WL: gl.constexpr, WL1: gl.constexpr):
        """With ``MmaConfig.k_chunks``: tile row v (a physical row of the word layouts) is
        output column pid_n * COLS + v % COLS over chunk v // COLS of the split, k_chunk
        rows from chunk 0's. Returns (columns, word pointers, group-parameter offsets
        (column plus the chunk's first group), the word and parameter column masks);
        a chunk's groups are its rows' groups offset by k_chunk / GROUP_SIZE a chunk
        (k_chunk a multiple of the group, or one group for all of K)."""
        v = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, WL))
        offs_wn = pid_n * COLS + v % COLS
        w_ptrs = (qw_ptr + (offs_wr[None, :] + ((v // COLS) * (k_chunk >> 3))[:, None]) * stride_qk
                  + offs_wn[:, None])
        vz = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, WL1))
        cols_z = pid_n * COLS + vz % COLS
        offs_zn = cols_z + (vz // COLS) * (k_chunk // GROUP_SIZE) * stride_sg
        return offs_wn, w_ptrs, offs_zn, offs_wn < N, cols_z < N

    @gluon.jit
    def _store_chunk_sums(acc, out_ptr, pid_n, N, COLS: gl.constexpr, CHUNKS: gl.constexpr,
                          ORDER: gl.constexpr, NUM_WARPS: gl.constexpr):
        """Store out[0, pid_n * COLS ..] of a ``k_chunks`` tile: acc [CHUNKS * COLS, 8]
        (logical rows) holds at its row of physical tile row v and column j chunk j's
        product with tile row v's words, so the wanted terms lie where j == v // COLS;
        they are summed over the chunks of each column (rows put in physical order, then
        [CHUNKS, COLS]: one cross-warp sum a program) and stored as bf16."""
        MMA: gl.constexpr = acc.type.layout
        rows = physical_columns(gl.arange(0, acc.shape[0], layout=gl.SliceLayout(1, MMA)),
                                ORDER)
        j = gl.arange(0, acc.shape[1], layout=gl.SliceLayout(0, MMA))
        own = gl.sum(gl.where(j[None, :] == (rows // COLS)[:, None], acc, 0.0), axis=1)
        physical = logical_columns(gl.expand_dims(own, 1), _inverse_order(ORDER))
        sums = gl.sum(gl.reshape(physical, [CHUNKS, COLS]), axis=0)
        OUT: gl.constexpr = gl.BlockedLayout([1], [32], [NUM_WARPS], [0])
        cols = pid_n * COLS + gl.arange(0, COLS, layout=OUT)
        gl.store(out_ptr + cols, gl.convert_layout(sums, OUT).to(gl.bfloat16), mask=cols < N)

    @gluon.constexpr_function
    def _inverse_order(order):
        """The column order that undoes ``order``: ``logical_columns`` with it takes rows
        in logical order to physical order."""
        order = plain_order(order)
        inverse = [0] * len(order)
        for j, b in enumerate(order):
            inverse[b] = j
        return tuple(inverse)

    @gluon.jit
    def _w4_mma_kernel(
        x_ptr, qw_ptr, s_ptr, z_ptr, out_ptr, part_ptr, count_ptr,
        M, N, K, K_SPLIT, stride_xm, stride_qk, stride_sg, stride_om,
        GROUP_SIZE: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
        BLOCK_K: gl.constexpr, SPLIT, HAS_SPLIT: gl.constexpr, NUM_WARPS: gl.constexpr,
        LOAD_STEPS: gl.constexpr, VECTOR_COLUMNS: gl.constexpr,
        PARAMS_AHEAD: gl.constexpr, EVEN: gl.constexpr, PAIRED: gl.constexpr,
        PDL: gl.constexpr, PDL_TRIGGER: gl.constexpr, LAST_SPLIT_REDUCES: gl.constexpr,
        BY_SUMS: gl.constexpr = 0,
        SUM_STEPS: gl.constexpr = 1, X_ROWS: gl.constexpr = 1,
        K_CHUNKS: gl.constexpr = 0, REAL_BLOCKS: gl.constexpr = 0,
        STEPS_UP_FRONT: gl.constexpr = False,
    ):
        """out^T = W^T x^T: the weight is the MMA's A operand (16 output columns per MMA
        row block) and x^T its B operand (8 rows of x per MMA column block), so M <= 8
        pads to 8 rows, not 16, and each MMA's x fragment is one contiguous load. With
        PDL (``tamis.kernels.pdl``) the first words, scales and zero points load before
        the wait for the kernel before, x and every store after it."""
        if PDL_TRIGGER == 1:
            gdc_launch_dependents()
        MMA: gl.constexpr = gl.NVMMADistributedLayout(
            version=[2, 0], warps_per_cta=[NUM_WARPS, 1], instr_shape=[16, 8])
        A_LAYOUT: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
        B_LAYOUT: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=2)
        STEP_K: gl.constexpr = BLOCK_K * LOAD_STEPS  # rows of K loaded together
        ORDER: gl.constexpr = column_order(gl.to_linear_layout(A_LAYOUT, [BLOCK_N, BLOCK_K]),
                                           VECTOR_COLUMNS)
        WL: gl.constexpr = word_layout(gl.to_linear_layout(A_LAYOUT, [BLOCK_N, STEP_K]), ORDER)
        XL: gl.constexpr = x_tile_layout(gl.to_linear_layout(B_LAYOUT, [STEP_K, BLOCK_M]))
        WL1: gl.constexpr = word_layout(gl.to_linear_layout(A_LAYOUT, [BLOCK_N, BLOCK_K]), ORDER)
        XL1: gl.constexpr = x_tile_layout(gl.to_linear_layout(B_LAYOUT, [BLOCK_K, BLOCK_M]))
        BLOCK_KW: gl.constexpr = STEP_K // 8

        pid_n = gl.program_id(0)
        pid_k = gl.program_id(1)
        pid_m = gl.program_id(2)
        n_out = N  # columns this program stores below
        if REAL_BLOCKS:  # a grid padded to whole multiprocessors (``MmaConfig.whole_wave``)
            if pid_n >= REAL_BLOCKS:  # an extra program: an earlier tile again, unstored
                n_out = 0
                pid_n = pid_n % REAL_BLOCKS
        k_lo = pid_k * K_SPLIT
        k_hi = gl.minimum(k_lo + K_SPLIT, K)
        if K_CHUNKS:  # the tile's rows are (chunk, column): the loop walks chunk 0's rows
            # whole steps of at least 32 rows (``_check_k_chunks``): told so, x's chunks
            # load as 16-byte vectors
            k_chunk = gl.multiple_of(K_SPLIT // K_CHUNKS, 32)
            k_hi = k_lo + k_chunk
        offs_wn = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, WL))
        offs_wr = gl.arange(0, BLOCK_KW, layout=gl.SliceLayout(0, WL))
        offs_xk = gl.arange(0, STEP_K, layout=gl.SliceLayout(1, XL))
        offs_xm = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, XL))
        offs_cn = pid_n * BLOCK_N + physical_columns(
            gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, MMA)), ORDER)
        offs_cm = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, MMA))
        mask_wn = offs_wn < N
        offs_zn = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, WL1))
        mask_zn = offs_zn < N
        mask_cn = offs_cn < N
        w_ptrs = qw_ptr + offs_wr[None, :] * stride_qk + offs_wn[:, None]
        x_m = M
        x_stride = stride_xm
        if K_CHUNKS:
            offs_wn, w_ptrs, offs_zn, mask_wn, mask_zn = _chunked_operands(
                qw_ptr, pid_n, N, k_chunk, stride_qk, stride_sg, offs_wr, BLOCK_N // K_CHUNKS,
                BLOCK_N, GROUP_SIZE, WL, WL1)
            # column j of x^T: chunk j of the one row (M == 1), as a row of x
            x_m = K_CHUNKS
            x_stride = k_chunk
        x_ptrs = x_ptr + _x_rows(offs_xm, x_m)[None, :] * x_stride + offs_xk[:, None]

        acc = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, MMA)
        last = k_lo + (k_hi - k_lo - 1) // STEP_K * STEP_K  # this split's last load
        AHEAD: gl.constexpr = PARAMS_AHEAD
        ahead = _load_words(w_ptrs, (k_lo >> 3) * stride_qk, (k_lo >> 3) + offs_wr, mask_wn,
                            K, EVEN)
        if AHEAD:
            nzz_ahead, s_ahead = _group_params(z_ptr, s_ptr, stride_sg, k_lo, K, offs_zn,
                                               mask_zn, offs_cn, GROUP_SIZE, ORDER, BY_SUMS)
            if LOAD_STEPS == 2:  # the second step's group
                nzz2_ahead, s2_ahead = _group_params(z_ptr, s_ptr, stride_sg, k_lo + BLOCK_K,
                                                     K, offs_zn, mask_zn, offs_cn,
                                                     GROUP_SIZE, ORDER)
        if PDL:
            gdc_wait()  # x and the outputs belong to the kernels before this one
        if PAIRED:  # x^T as bf16 pairs: one 32-bit register each across the loop's back edge
            XW: gl.constexpr = x_word_layout(XL)
            offs_xk = gl.arange(0, STEP_K // 2, layout=gl.SliceLayout(1, XW))
            offs_xm = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, XW))
            x_ptrs = (x_ptr.to(gl.pointer_type(gl.int32), bitcast=True)
                      + _x_rows(offs_xm, x_m)[None, :] * (x_stride // 2) + offs_xk[:, None])
            x_next = _load_x_words(x_ptrs, k_lo, offs_xk, K, EVEN)
            x_sums = 0
            if BY_SUMS:
                x_sums = _x_step_sums(x_ptr, x_stride, k_lo, k_hi, pid_m * BLOCK_M, x_m,
                                      STEP_K, SUM_STEPS, BLOCK_M, X_ROWS, NUM_WARPS)
        elif AHEAD:
            x_next = _load_x(x_ptrs, k_lo, offs_xk, K, EVEN)
        if PAIRED and STEPS_UP_FRONT:  # exactly 4 steps (``_check_steps_up_front``)
            acc = _four_steps_up_front(
                acc, ahead, x_next, nzz_ahead, s_ahead, x_sums, w_ptrs, x_ptrs, z_ptr,
                s_ptr, k_lo, stride_qk, stride_sg, offs_wr, mask_wn, offs_zn, mask_zn,
                offs_cn, offs_xk, K, STEP_K, GROUP_SIZE, EVEN, ORDER, BY_SUMS, A_LAYOUT,
                B_LAYOUT)
        elif PAIRED:  # (a) and (b) alternate; the pair's second load is (a) again
            steps = (k_hi - k_lo + STEP_K - 1) // STEP_K
            for k0 in range(k_lo, k_hi - STEP_K, 2 * STEP_K):
                words_b, nzz_b, s_b, x_b = _load_step(
                    w_ptrs, x_ptrs, z_ptr, s_ptr, k0 + STEP_K, stride_qk, stride_sg, offs_wr,
                    mask_wn, offs_zn, mask_zn, offs_cn, offs_xk, K,
                    GROUP_SIZE, EVEN, ORDER, BY_SUMS)
                step = (k0 - k_lo) // STEP_K
                acc = _paired_step(acc, ahead, x_next, nzz_ahead, s_ahead, x_sums, step,
                                   BY_SUMS, A_LAYOUT, B_LAYOUT, ORDER)
                k2 = gl.minimum(k0 + 2 * STEP_K, last)  # past the last: that load again
                ahead, nzz_ahead, s_ahead, x_next = _load_step(
                    w_ptrs, x_ptrs, z_ptr, s_ptr, k2, stride_qk, stride_sg, offs_wr, mask_wn,
                    offs_zn, mask_zn, offs_cn, offs_xk, K, GROUP_SIZE, EVEN, ORDER, BY_SUMS)
                acc = _paired_step(acc, words_b, x_b, nzz_b, s_b, x_sums, step + 1, BY_SUMS,
                                   A_LAYOUT, B_LAYOUT, ORDER)
            if steps % 2 == 1:  # an odd step left, in (a)
                acc = _paired_step(acc, ahead, x_next, nzz_ahead, s_ahead, x_sums, steps - 1,
                                   BY_SUMS, A_LAYOUT, B_LAYOUT, ORDER)
        else:
            for k0 in range(k_lo, k_hi, STEP_K):
                # Past the split's last load a prefetch reloads that load (no bounds check).
                k1 = k0 + STEP_K * (k0 < last).to(gl.int32)  # min(k0 + STEP_K, last), aligned
                words = ahead
                ahead = _load_words(w_ptrs, (k1 >> 3) * stride_qk, (k1 >> 3) + offs_wr,
                                    mask_wn, K, EVEN)
                if AHEAD:
                    nzz, s = nzz_ahead, s_ahead
                    nzz_ahead, s_ahead = _group_params(z_ptr, s_ptr, stride_sg, k1, K,
                                                       offs_zn, mask_zn, offs_cn,
                                                       GROUP_SIZE, ORDER)
                    if LOAD_STEPS == 2:
                        nzz2, s2 = nzz2_ahead, s2_ahead
                        nzz2_ahead, s2_ahead = _group_params(
                            z_ptr, s_ptr, stride_sg, k1 + BLOCK_K, K, offs_zn, mask_zn,
                            offs_cn, GROUP_SIZE, ORDER)
                if AHEAD:
                    x = x_next
                    x_next = _load_x(x_ptrs, k1, offs_xk, K, EVEN)
                else:
                    x = _load_x(x_ptrs, k0, offs_xk, K, EVEN)
                if AHEAD and LOAD_STEPS == 1:
                    acc = _step_with(acc, words, x, nzz, s, A_LAYOUT, B_LAYOUT, ORDER)
                elif AHEAD:
                    acc = _two_steps_with(acc, words, x, nzz, s, nzz2, s2, A_LAYOUT, B_LAYOUT,
                                          ORDER, WL1, XL1)
                elif LOAD_STEPS == 1:
                    acc = _step(acc, words, x, k0, z_ptr, s_ptr, stride_sg, offs_zn, mask_zn,
                                offs_cn, K, GROUP_SIZE, A_LAYOUT, B_LAYOUT, ORDER)
                else:
                    acc = _two_steps(acc, words, x, k0, z_ptr, s_ptr, stride_sg, offs_zn,
                                     mask_zn, offs_cn, K, GROUP_SIZE, A_LAYOUT, B_LAYOUT,
                                     ORDER, WL1, XL1)

        if PDL_TRIGGER == 2:
            gdc_launch_dependents()
        if K_CHUNKS:
            _store_chunk_sums(acc, out_ptr, pid_n, n_out, BLOCK_N // K_CHUNKS, K_CHUNKS, ORDER,
                              NUM_WARPS)
            return
        store_out_t(acc, out_ptr, part_ptr, count_ptr, offs_cm, offs_cn,
                    (offs_cm < M)[None, :] & mask_cn[:, None], stride_om, M, N,
                    pid_m, pid_n, pid_k, SPLIT, HAS_SPLIT, LAST_SPLIT_REDUCES, False,
                    NUM_WARPS)

    @gluon.jit
    def _x_rows(offs_m, M):
        """Rows of x to read for tile rows ``offs_m``: past M, row M - 1 again."""
        return gl.minimum(offs_m, M - 1)

    @gluon.jit
    def _load_x_words(x_ptrs, k0, offs_kw, K, EVEN: gl.constexpr):
        """``_load_x`` as bf16 pairs: ``x_ptrs`` int32 pointers over [STEP_K / 2, BLOCK_M]
        (``x_word_layout``), word i of a column rows 2i and 2i + 1."""
        if EVEN:
            return gl.load(x_ptrs + (k0 >> 1))
        return gl.load(x_ptrs + (k0 >> 1), mask=(k0 + 2 * offs_kw < K)[:, None], other=0)

    @gluon.jit
    def _x_from_words(w, XL: gl.constexpr):
        """bf16 pairs [STEP_K / 2, BLOCK_M] -> the x^T tile [STEP_K, BLOCK_M] in XL (no
        data moves: each pair's halves stay in its register)."""
        lo, hi = bf16_halves(w)
        t = gl.permute(gl.join(lo, hi), [0, 2, 1])
        t = gl.reshape(t, [2 * w.shape[0], w.shape[1]])
        return gl.convert_layout(t, XL, assert_trivial=True)

    @gluon.jit
    def _load_x(x_ptrs, k0, offs_k, K, EVEN: gl.constexpr):
        """The x^T tile of rows k0.. (physical order); rows past K read as 0. The
        pointers of rows of x past M repeat row M - 1 (``_x_rows``): those columns of
        the product are never stored, and loading them unmasked spares the zeroing
        and predicates of a masked load."""
        if EVEN:
            return gl.load(x_ptrs + k0)
        return gl.load(x_ptrs + k0, mask=(k0 + offs_k < K)[:, None], other=0.0)

    @gluon.jit
    def _load_words(w_ptrs, offset, rows, mask_n, K, EVEN: gl.constexpr):
        """The word tile at ``offset``; past K or N (unless EVEN) words read as 0."""
        if EVEN:
            return gl.load(w_ptrs + offset)
        return gl.load(w_ptrs + offset, mask=(rows * 8 < K)[None, :] & mask_n[:, None], other=0)


def mma_constexprs(config: MmaConfig, block_m: int, group_size: int, splits: int,
                   even: bool, *, pdl_wait: bool = False, pdl_trigger: int = 0,
                   k_split: int = 0, m: int = 1, real_blocks: int = 0) -> dict:
    """The compile-time arguments of ``_w4_mma_kernel`` for a launch of ``splits``
    programs along K of ``k_split`` rows each, on x of m rows (shared with the sm_90
    build tests, so that they build what runs); ``real_blocks``: the column blocks of a
    grid padded past them (``whole_wave_programs``), else 0."""
    by_sums = config.zeros_by_x_sums and runs_paired(config)
    if by_sums and k_split <= 0:
        raise ValueError("zeros_by_x_sums sizes its buffer by the rows a split takes: "
                         f"give k_split > 0, got {k_split}")
    steps = -(-chunk_rows(config, k_split) // config.block_k) if by_sums else 1
    # BY_SUMS: 0 zero points applied per word, 1 by sums of x from ``_x_step_sums``' pass
    return dict(BY_SUMS=int(by_sums), SUM_STEPS=1 << (steps - 1).bit_length(),
                X_ROWS=min(config.k_chunks or m, block_m) if by_sums else 1,
                GROUP_SIZE=group_size, BLOCK_M=block_m,
                BLOCK_N=tile_rows(config), K_CHUNKS=config.k_chunks,
                BLOCK_K=config.block_k, HAS_SPLIT=splits > 1,
                NUM_WARPS=config.num_warps, LOAD_STEPS=config.load_steps,
                VECTOR_COLUMNS=config.vector_columns, PARAMS_AHEAD=config.params_ahead,
                EVEN=even, PAIRED=runs_paired(config), PDL=pdl_wait, PDL_TRIGGER=pdl_trigger,
                LAST_SPLIT_REDUCES=last_split_constexpr(config.last_split_reduces, splits),
                REAL_BLOCKS=real_blocks,
                STEPS_UP_FRONT=config.steps_up_front)


def mma_compile_options(constexprs: dict, max_registers: int = 0) -> dict:
    """Compiler options of a launch with these constexprs (``mma_constexprs``): a
    config's own register cap (``MmaConfig.max_registers``) where it sets one, else with
    zero points by sums of x a cap of 128: left to itself ptxas builds that loop to
    80-98 registers by moving each load to just before its first use (0-12 MMAs ahead
    instead of 10-22), and each pair of steps then waits out a memory round trip (9.3
    against 7.1 us on 4096 x 6144). At 128 the loads stay a step ahead,
    and ``one_wave_split`` counts on 128 anyway."""
    if max_registers:
        return {"maxnreg": max_registers}
    return {"maxnreg": 128} if constexprs["BY_SUMS"] else {}


def w4a16_gemm_mma(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor,
                   zeros: torch.Tensor, group_size: int,
                   config: MmaConfig | None = None) -> torch.Tensor:
    """``w4a16_gemm_ref`` for x [M, K] bf16 (``mma_supported``) with the weight in this
    kernel's stored layout (``mma_pack``); zero points must be integers in [0, 16]."""
    if gluon is None:
        raise RuntimeError("w4a16_gemm_mma needs triton with Gluon")
    m, k = x.shape
    n = packed.shape[1]
    if not mma_supported(x, k, group_size, 4):
        raise ValueError(f"MMA path takes bf16 x with M <= {MMA_MAX_M}, K % 32 == 0 and "
                         f"32-row groups; got M={m}, K={k}, group {group_size}, {x.dtype}")
    x = x.contiguous()
    if x.data_ptr() % 4:  # the one-row loop reads x as bf16 pairs (``_load_x_words``)
        x = x.clone()
    num_sms = sm_count(x)
    config = config or pick_mma_config(m, n, k, group_size, num_sms)
    if group_size < k and group_size % config.block_k:
        raise ValueError(f"block_k {config.block_k} does not divide the group size {group_size}")
    if config.load_steps not in (1, 2):
        raise ValueError(f"MmaConfig takes load_steps 1 or 2; got {config.load_steps}")
    block_m = min(config.max_block_m, 8 if m <= 8 else (16 if m <= 16 else
                                                        (32 if m <= 32 else 64)))
    block_m = max(block_m, config.k_chunks)  # x^T's columns hold every chunk (16: two n8)
    splits, k_split = even_split(k, config.block_k * config.load_steps, config.split_k)
    if config.k_chunks:
        _check_k_chunks(config, m, splits, k_split, group_size, k)
    if config.steps_up_front:
        _check_steps_up_front(config, k_split)
    blocks = -(-n // config.block_n)
    m_blocks = -(-m // block_m)
    grid_n = whole_wave_programs(config, blocks, num_sms)
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    constexprs = mma_constexprs(config, block_m, min(group_size, k), splits,
                                k % k_split == 0 and n % config.block_n == 0,
                                pdl_wait=pdl.launch(x.device),
                                pdl_trigger=pdl.trigger(x.device, m), k_split=k_split, m=m,
                                real_blocks=blocks if grid_n > blocks else 0)
    partials, counters = split_buffers(out, splits, (m, n), blocks * m_blocks)
    _w4_mma_kernel[(grid_n, splits, m_blocks)](
        x, packed, scales, zeros, out, partials, counters,
        m, n, k, k_split, x.stride(0), packed.stride(0), scales.stride(0), out.stride(0),
        SPLIT=splits, **constexprs, num_warps=config.num_warps,
        launch_pdl=pdl.launch(x.device),
        **mma_compile_options(constexprs, config.max_registers),
    )
    return out


def _check_k_chunks(config: MmaConfig, m: int, splits: int, k_split: int, group_size: int,
                    k: int) -> None:
    """Refuse a ``k_chunks`` launch the chunked path does not implement: it needs one row
    of x, loads a step ahead (paired or not, one or two steps a load), one split, and 2,
    4, 8 or 16 chunks of whole loads lying on group boundaries (or one group for all of
    K)."""
    unsupported = {"k_chunks": config.k_chunks not in (2, 4, 8, 16), "m": m != 1,
                   "params_ahead": not config.params_ahead,
                   "split_k": splits != 1,
                   "chunk rows": chunks_not_whole(config, k_split, group_size, k)}
    named = [name for name, clash in unsupported.items() if clash]
    if named:
        raise ValueError("k_chunks takes 2, 4, 8 or 16 chunks of whole loads (and whole "
                         "groups) at one row, loads a step ahead (params_ahead), "
                         f"one split; these clash: {named} "
                         f"(M={m}, K={k}, {splits} splits of {k_split} rows, group {group_size})")


def _check_steps_up_front(config: MmaConfig, k_split: int) -> None:
    """Refuse ``steps_up_front`` off its path: a paired ``k_chunks`` tile whose chunks
    are exactly 4 steps of ``block_k`` rows."""
    rows = chunk_rows(config, k_split)
    if not (config.k_chunks and runs_paired(config) and chunks_of_four_steps(config, k_split)):
        raise ValueError("steps_up_front takes a k_chunks tile with paired steps whose chunks "
                         f"are 4 steps of block_k rows; got k_chunks={config.k_chunks}, "
                         f"paired={runs_paired(config)}, chunks of {rows} rows, "
                         f"block_k={config.block_k}")
