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
too (``_column_order``): the columns a thread holds in registers are adjacent in memory,
so its words of one row load as one vector of up to 16 bytes, and each result is stored
at its physical column.

Per word, one inline-PTX block (``_UNPACK``)::

    v_j = lop3(word >> 4j, 0x000F000F, 0x43004300)   # bf16x2 (128 + q_j, 128 + q_{j+4})
    v_j = fma(v_j, 1, -(128 + z))                      # (q_j - z, q_{j+4} - z), exact

(integer zero points: ``q - z`` is an integer of at most 5 bits, exact in bf16). The MMA
multiplies that tile by x^T (rows of x past M are zeros) in fp32, and the group scale
multiplies each step's product per output column in fp32: every step lies inside one
group. K is split over programs; the last program of a tile reduces the splits
(``tamis.kernels.splitk``). Knobs (``MmaConfig``): words of 1, 2 or 4 steps load together
(more bytes in flight per thread), and above 16 rows of x the program can stage each x
tile in shared memory once instead of every warp loading it.

Needs: CUDA, Gluon (triton >= 3.5), bf16 x, 4-bit codes, K % 32 == 0, integer zero
points in [0, 16], groups a multiple of 32 rows or the whole K (``mma_supported``,
``mma_layout_supported``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from tamis.kernels.splitk import even_split, sm_count, split_counters
from tamis.kernels.w4a16 import code_shifts

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import mma_v2
except ImportError:  # no triton, or one without Gluon
    gluon = None

MMA_MAX_M = 64


@dataclass(frozen=True)
class MmaConfig:
    block_n: int = 128      # output columns per program (16 per warp per MMA row block)
    block_k: int = 128      # rows of K per step (inside one group)
    split_k: int = 8        # programs along K per column block
    num_warps: int = 8
    prefetch: int = 1       # 1: words one step ahead, 0: none
    max_block_m: int = 16   # rows of x per program (more rows: a grid axis)
    # Warps splitting the rows of x (each unpacks the whole weight tile: more dequantizing,
    # x fragments not replicated); the others split the columns.
    warps_m: int = 1
    # x tiles loaded once per program into shared memory, each warp reading its
    # fragments there (else each warp loads them from global memory: at 33..64 rows the
    # warps of a program would read the same x tile several times over).
    x_shared: bool = False
    # Steps (of block_k rows) whose words and x load together: more bytes in flight per
    # thread (1, 2 or 4).
    load_steps: int = 1
    # Output columns permuted so that a thread's words are adjacent (``_column_order``).
    vector_columns: bool = True


def pick_mma_config(m: int, n: int, k: int, group_size: int, num_sms: int = 132) -> MmaConfig:
    """Tiles from the H200 sweeps (bench/results/quant.md), steps of 128 rows of K (or of
    the group when it is shorter), 16 rows of x per program.

    M = 1 (session 8, columns permuted for vector loads): wide layers (N >= 8192) 64
    columns on 2 warps split 4 ways; deep ones (K >= 8192) 256 columns on 8 warps split 16
    ways; else 128 columns on 4 warps split 8 ways. 2..8 rows (session 7, identity
    column order): 128 columns on 8 warps split 8 ways; 9..16 rows (session 8): 64
    columns on 2 warps, two steps per load, split 4 ways (8 when K >= 8192); wide layers
    (2..16 rows) 64 columns on 2 warps split 2 ways. 17..32 rows: 64 columns on 2 warps
    split 4 ways (unsplit on wide layers), or 128 on 4 warps split 8 ways when K >= 8192."""
    block_k = 128 if group_size >= k or group_size % 128 == 0 else (
        64 if group_size % 64 == 0 else 32)
    if m == 1:
        if n >= 8192:
            return MmaConfig(64, block_k, 4, 2)
        if k >= 8192:
            return MmaConfig(256, block_k, 16, 8)
        return MmaConfig(128, block_k, 8, 4)
    if m > 16:  # 17..32 rows, as two 16-row blocks
        if n >= 8192:
            return MmaConfig(64, block_k, 1, 2, vector_columns=False)
        if k >= 8192:
            return MmaConfig(128, block_k, 8, 4, vector_columns=False)
        return MmaConfig(64, block_k, 4, 2, vector_columns=False)
    if n >= 8192:
        return MmaConfig(64, block_k, 2, 2, vector_columns=False)
    if m > 8:  # 9..16 rows: 64 columns on 2 warps, two steps per load
        return MmaConfig(64, block_k, 8 if k >= 8192 else 4, 2, load_steps=2,
                         vector_columns=False)
    return MmaConfig(128, block_k, 8, 8, vector_columns=False)


def _weight_supported(k: int, group_size: int, bits: int) -> bool:
    """Gluon present, 4-bit codes, K % 32 == 0, groups of 32-row multiples or one group."""
    return (gluon is not None and bits == 4 and k % 32 == 0
            and (group_size % 32 == 0 or group_size >= k))


def mma_layout_supported(k: int, group_size: int, bits: int, zeros: torch.Tensor) -> bool:
    """Whether a layer's weight can take this kernel's layout: ``_weight_supported`` and
    integer zero points in [0, 16]."""
    return (_weight_supported(k, group_size, bits)
            and bool(((zeros >= 0) & (zeros <= 16) & (zeros == zeros.round())).all()))


def mma_supported(x: torch.Tensor, k: int, group_size: int, bits: int) -> bool:
    """A call the kernel takes: bf16 x with at most MMA_MAX_M rows on a weight of
    ``_weight_supported`` shape (zero points are checked once, by ``mma_layout_supported``)."""
    return (x.dtype == torch.bfloat16 and x.shape[0] <= MMA_MAX_M
            and _weight_supported(k, group_size, bits))


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

    # Per word: $8 the word, $9 the column's -(128 + z) twice as bf16x2; $0..$7 the
    # (lo, hi) halves of v_0..v_3, bf16.
    _UNPACK_TEMPLATE = """{
 .reg .b32 t1, t2, t3, v0, v1, v2, v3, one;
 mov.b32 one, 0x3F803F80;
 shr.u32 t1, $8, 4;
 shr.u32 t2, $8, 8;
 shr.u32 t3, $8, 12;
 lop3.b32 v0, $8, 0x000F000F, 0x43004300, 0xEA;
 lop3.b32 v1, t1, 0x000F000F, 0x43004300, 0xEA;
 lop3.b32 v2, t2, 0x000F000F, 0x43004300, 0xEA;
 lop3.b32 v3, t3, 0x000F000F, 0x43004300, 0xEA;
 fma.rn.bf16x2 v0, v0, one, $9;
 fma.rn.bf16x2 v1, v1, one, $9;
 fma.rn.bf16x2 v2, v2, one, $9;
 fma.rn.bf16x2 v3, v3, one, $9;
 mov.b32 {$0, $1}, v0;
 mov.b32 {$2, $3}, v1;
 mov.b32 {$4, $5}, v2;
 mov.b32 {$6, $7}, v3;
}"""
    _UNPACK = gl.constexpr(_UNPACK_TEMPLATE)

    @gluon.jit
    def _bf16x2(v):
        """Float values -> their bf16 bits twice in one int32 (the (lo, hi) of a bf16x2)."""
        bits = v.to(gl.bfloat16).to(gl.int16, bitcast=True).to(gl.int32) & 0xFFFF
        return bits | (bits << 16)

    @gluon.constexpr_function
    def _column_order(a_layout, vector_columns):
        """For each bit j of a logical output column (the A operand's row m), the bit of
        the physical column a thread loads in its place. With ``vector_columns`` the
        column bits a thread holds in registers come first, then its lane bits, then its
        warp bits: a thread's words are adjacent in memory (one vector load instead of one
        load per word) and the kernel stores each result at its physical column. Else
        the identity."""
        def bits(bases):
            return [b[0].bit_length() - 1 for b in bases if b[0] and not b[1]]
        order = bits(a_layout.reg_bases) + bits(a_layout.lane_bases) + bits(a_layout.warp_bases)
        if not vector_columns:
            return tuple(range(len(order)))
        return tuple(order.index(j) for j in range(len(order)))

    @gluon.constexpr_function
    def _word_layout(a_layout, order):
        """The layout of the word tile [BLOCK_N, BLOCK_K / 8] (physical columns) whose
        unpacked codes, columns permuted to logical order (``_logical_columns``), land in
        ``a_layout`` (the A operand's linear layout of [BLOCK_N, BLOCK_K], bases [m, k'])
        with no data movement: its register bases for logical rows 1, 8, 16 become the 8
        codes of a word; its other row bases map k' to word row
        ((k' >> 1) & 3) + 4 * (k' >> 5); column bases map m to its physical column
        (``order``), those in registers first so that they load as one vector."""
        def to_word(basis):
            n, k = basis
            if n:
                n = 1 << order[n.bit_length() - 1]
            return [n, ((k >> 1) & 3) + 4 * (k >> 5)]
        regs = [to_word(b) for b in a_layout.reg_bases if b not in ([0, 1], [0, 8], [0, 16])]
        regs = sorted(regs, key=lambda b: (b[0] == 0, b[0]))
        shape = [a_layout.shape[0], a_layout.shape[1] // 8]
        return gl.DistributedLinearLayout(
            reg_bases=regs, lane_bases=[to_word(b) for b in a_layout.lane_bases],
            warp_bases=[to_word(b) for b in a_layout.warp_bases], block_bases=[], shape=shape)

    @gluon.constexpr_function
    def _column_permutation(order):
        """The ``gl.permute`` order that takes a tensor reshaped to [2] * bits + [rest] in
        physical column bits (most significant first) to logical bits."""
        order = _plain(order)
        nb = len(order)
        return tuple(nb - 1 - order[j] for j in reversed(range(nb))) + (nb,)

    @gluon.constexpr_function
    def _plain(order):
        """A column order as Python ints (a constexpr tuple passed on to a jitted function
        arrives with its items wrapped)."""
        return tuple(getattr(v, "value", v) for v in getattr(order, "value", order))

    @gluon.constexpr_function
    def _bit_shape(order, rest):
        """[2] per column bit, then ``rest``."""
        return [2] * len(_plain(order)) + [rest]

    @gluon.constexpr_function
    def _bit_count(order):
        return len(_plain(order))

    @gluon.jit
    def _logical_columns(t, ORDER: gl.constexpr):
        """t [BLOCK_N, R], rows in physical column order -> rows in logical order."""
        BN: gl.constexpr = t.shape[0]
        R: gl.constexpr = t.shape[1]
        u = gl.reshape(t, _bit_shape(ORDER, R))
        u = gl.permute(u, _column_permutation(ORDER).value)
        return gl.reshape(u, [BN, R])

    @gluon.jit
    def _physical_columns(local, ORDER: gl.constexpr):
        """Logical columns 0..BLOCK_N-1 of a tile -> their physical columns."""
        col = gl.zeros_like(local)
        for j in gl.static_range(_bit_count(ORDER)):
            col |= ((local >> j) & 1) << ORDER[j]
        return col

    @gluon.constexpr_function
    def _x_layout(b_layout):
        """The layout of the x^T tile [BLOCK_K, BLOCK_M] in physical row order whose
        permutation to logical order (``_logical_x``) is ``b_layout`` (the B operand's
        linear layout, bases [k', m]): every row basis k' goes to pi(k'); the register
        bases that are physical rows 1, 2, 4 come first, so that each thread's 8
        contiguous values load as one vector."""
        def pi(k):
            return ((k & 1) | ((k >> 3) & 1) << 1 | ((k >> 4) & 1) << 2
                    | ((k >> 1) & 1) << 3 | ((k >> 2) & 1) << 4 | (k >> 5) << 5)
        regs = [[pi(k), m] for k, m in b_layout.reg_bases]
        regs = sorted(regs, key=lambda b: 0 if b in ([1, 0], [2, 0], [4, 0]) else 1)
        return gl.DistributedLinearLayout(
            reg_bases=regs, lane_bases=[[pi(k), m] for k, m in b_layout.lane_bases],
            warp_bases=[[pi(k), m] for k, m in b_layout.warp_bases], block_bases=[],
            shape=b_layout.shape)

    @gluon.jit
    def _logical_x(x, B_LAYOUT: gl.constexpr):
        """x^T [BLOCK_K, BLOCK_M] in physical row order -> logical order, in B_LAYOUT."""
        BK: gl.constexpr = x.shape[0]
        BM: gl.constexpr = x.shape[1]
        t = gl.reshape(x, [BK // 32, 2, 2, 2, 2, 2, BM])  # physical bits 4, 3, 2, 1, 0
        t = gl.permute(t, [0, 3, 4, 1, 2, 5, 6])            # k' bits 4, 3, 2, 1, 0
        t = gl.reshape(t, [BK, BM])
        return gl.convert_layout(t, B_LAYOUT, assert_trivial=True)

    @gluon.jit
    def _unpack_tile(words, nzz, A_LAYOUT: gl.constexpr, ORDER: gl.constexpr):
        """Words [BLOCK_N, BLOCK_K / 8] (physical columns) -> (q - z) [BLOCK_N, BLOCK_K]
        (bf16, logical columns) in A_LAYOUT."""
        BN: gl.constexpr = words.shape[0]
        KW: gl.constexpr = words.shape[1]
        o0, o1, o2, o3, o4, o5, o6, o7 = gl.inline_asm_elementwise(
            _UNPACK, "=h,=h,=h,=h,=h,=h,=h,=h,r,r", [words, nzz],
            dtype=(gl.bfloat16,) * 8, is_pure=True, pack=1)
        q0 = gl.join(gl.join(o0, o1), gl.join(o2, o3))
        q1 = gl.join(gl.join(o4, o5), gl.join(o6, o7))
        t = gl.join(q0, q1)                            # [BN, KW, h, j0, j1]
        t = gl.reshape(t, [BN, KW // 4, 4, 2, 2, 2])   # word row = 4 r_hi + r_lo
        t = gl.permute(t, [0, 1, 5, 4, 2, 3])          # k': r_hi, j1, j0, r_lo, h
        t = _logical_columns(gl.reshape(t, [BN, KW * 8]), ORDER)
        return gl.convert_layout(t, A_LAYOUT, assert_trivial=True)

    @gluon.jit
    def _step(acc, words, x, k, z_ptr, s_ptr, stride_sg, offs_wn, mask_wn, offs_cn, mask_cn,
              K, GROUP_SIZE: gl.constexpr, A_LAYOUT: gl.constexpr, B_LAYOUT: gl.constexpr,
              ORDER: gl.constexpr):
        """acc + the product of one step (rows k.. of K, inside one group; past K, x reads
        as 0 and the last group's scale stands in)."""
        xb = _logical_x(x, B_LAYOUT)
        g = gl.minimum(k, K - 1) // GROUP_SIZE
        nzz = _bf16x2(-(gl.load(z_ptr + g * stride_sg + offs_wn, mask=mask_wn,
                                other=0.0).to(gl.float32) + 128.0))
        w = _unpack_tile(words, nzz[:, None], A_LAYOUT, ORDER)
        s = gl.load(s_ptr + g * stride_sg + offs_cn, mask=mask_cn, other=0.0)
        return acc + mma_v2(w, xb, gl.zeros_like(acc)) * s.to(gl.float32)[:, None]

    @gluon.jit
    def _two_steps(acc, words, x, k, z_ptr, s_ptr, stride_sg, offs_wn, mask_wn, offs_cn,
                   mask_cn, K, GROUP_SIZE: gl.constexpr, A_LAYOUT: gl.constexpr,
                   B_LAYOUT: gl.constexpr, ORDER: gl.constexpr, WL: gl.constexpr,
                   XL: gl.constexpr):
        """``_step`` over the two halves of a load of two steps."""
        words_a, words_b = _halves(words, 1, WL)
        x_a, x_b = _halves(x, 0, XL)
        acc = _step(acc, words_a, x_a, k, z_ptr, s_ptr, stride_sg, offs_wn, mask_wn,
                    offs_cn, mask_cn, K, GROUP_SIZE, A_LAYOUT, B_LAYOUT, ORDER)
        return _step(acc, words_b, x_b, k + x_a.shape[0], z_ptr, s_ptr, stride_sg, offs_wn,
                     mask_wn, offs_cn, mask_cn, K, GROUP_SIZE, A_LAYOUT, B_LAYOUT, ORDER)

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
    def _w4_mma_kernel(
        x_ptr, qw_ptr, s_ptr, z_ptr, out_ptr, part_ptr, count_ptr,
        M, N, K, K_SPLIT, stride_xm, stride_qk, stride_sg, stride_om,
        GROUP_SIZE: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
        BLOCK_K: gl.constexpr, SPLIT, HAS_SPLIT: gl.constexpr, NUM_WARPS: gl.constexpr,
        WARPS_M: gl.constexpr, PREFETCH: gl.constexpr, X_SHARED: gl.constexpr,
        LOAD_STEPS: gl.constexpr, VECTOR_COLUMNS: gl.constexpr,
        EVEN: gl.constexpr,
    ):
        """out^T = W^T x^T: the weight is the MMA's A operand (16 output columns per MMA
        row block) and x^T its B operand (8 rows of x per MMA column block), so M <= 8
        pads to 8 rows, not 16, and each MMA's x fragment is one contiguous load."""
        MMA: gl.constexpr = gl.NVMMADistributedLayout(
            version=[2, 0], warps_per_cta=[NUM_WARPS // WARPS_M, WARPS_M], instr_shape=[16, 8])
        A_LAYOUT: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
        B_LAYOUT: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=2)
        STEP_K: gl.constexpr = BLOCK_K * LOAD_STEPS  # rows of K loaded together
        ORDER: gl.constexpr = _column_order(gl.to_linear_layout(A_LAYOUT, [BLOCK_N, BLOCK_K]),
                                            VECTOR_COLUMNS)
        WL: gl.constexpr = _word_layout(gl.to_linear_layout(A_LAYOUT, [BLOCK_N, STEP_K]), ORDER)
        XL: gl.constexpr = _x_layout(gl.to_linear_layout(B_LAYOUT, [STEP_K, BLOCK_M]))
        WL1: gl.constexpr = _word_layout(gl.to_linear_layout(A_LAYOUT, [BLOCK_N, BLOCK_K]), ORDER)
        XL1: gl.constexpr = _x_layout(gl.to_linear_layout(B_LAYOUT, [BLOCK_K, BLOCK_M]))
        BLOCK_KW: gl.constexpr = STEP_K // 8

        pid_n = gl.program_id(0)
        pid_k = gl.program_id(1)
        pid_m = gl.program_id(2)
        k_lo = pid_k * K_SPLIT
        k_hi = gl.minimum(k_lo + K_SPLIT, K)
        offs_wn = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, WL))
        offs_wr = gl.arange(0, BLOCK_KW, layout=gl.SliceLayout(0, WL))
        offs_xk = gl.arange(0, STEP_K, layout=gl.SliceLayout(1, XL))
        offs_xm = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, XL))
        offs_cn = pid_n * BLOCK_N + _physical_columns(
            gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, MMA)), ORDER)
        offs_cm = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, MMA))
        mask_wn = offs_wn < N
        offs_zn = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, WL1))
        mask_zn = offs_zn < N
        mask_cn = offs_cn < N
        mask_xm = offs_xm < M
        w_ptrs = qw_ptr + offs_wr[None, :] * stride_qk + offs_wn[:, None]
        x_ptrs = x_ptr + offs_xm[None, :] * stride_xm + offs_xk[:, None]

        acc = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, MMA)
        last = k_lo + (k_hi - k_lo - 1) // STEP_K * STEP_K  # this split's last load
        if PREFETCH:
            ahead = _load_words(w_ptrs, k_lo // 8 * stride_qk, k_lo // 8 + offs_wr, mask_wn,
                                K, EVEN)
        if X_SHARED:  # x tiles staged in shared memory, the next one held in registers
            XG: gl.constexpr = gl.BlockedLayout(
                [8, 1], [_min(STEP_K // 8, 32), 32 // _min(STEP_K // 8, 32)],
                [1, NUM_WARPS], [0, 1])
            XS: gl.constexpr = gl.PaddedSharedLayout.with_identity_for(
                [[STEP_K, _x_row_padding(STEP_K)]], [STEP_K, BLOCK_M], [0, 1])
            x_smem = gl.allocate_shared_memory(gl.bfloat16, [STEP_K, BLOCK_M], XS)
            offs_gk = gl.arange(0, STEP_K, layout=gl.SliceLayout(1, XG))
            offs_gm = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, XG))
            xg_ptrs = x_ptr + offs_gm[None, :] * stride_xm + offs_gk[:, None]
            x_ahead = _load_x(xg_ptrs, k_lo, offs_gk, offs_gm < M, K, EVEN)
        for k0 in range(k_lo, k_hi, STEP_K):
            # Past the split's last load a prefetch reloads that load (no bounds check).
            k1 = k0 + STEP_K * (k0 < last).to(gl.int32)  # min(k0 + STEP_K, last), aligned
            if PREFETCH:
                words = ahead
                ahead = _load_words(w_ptrs, k1 // 8 * stride_qk, k1 // 8 + offs_wr,
                                    mask_wn, K, EVEN)
            else:
                words = _load_words(w_ptrs, k0 // 8 * stride_qk, k0 // 8 + offs_wr, mask_wn,
                                    K, EVEN)
            if X_SHARED:
                gl.thread_barrier()  # every warp has read the last step's tile
                x_smem.store(x_ahead)
                x_ahead = _load_x(xg_ptrs, k1, offs_gk, offs_gm < M, K, EVEN)
                gl.thread_barrier()
                x = x_smem.load(XL)
            else:
                x = _load_x(x_ptrs, k0, offs_xk, mask_xm, K, EVEN)
            if LOAD_STEPS == 1:
                acc = _step(acc, words, x, k0, z_ptr, s_ptr, stride_sg, offs_zn, mask_zn,
                            offs_cn, mask_cn, K, GROUP_SIZE, A_LAYOUT, B_LAYOUT, ORDER)
            else:
                WL2: gl.constexpr = _word_layout(
                    gl.to_linear_layout(A_LAYOUT, [BLOCK_N, 2 * BLOCK_K]), ORDER)
                XL2: gl.constexpr = _x_layout(
                    gl.to_linear_layout(B_LAYOUT, [2 * BLOCK_K, BLOCK_M]))
                if LOAD_STEPS == 4:
                    words_a, words_b = _halves(words, 1, WL2)
                    x_a, x_b = _halves(x, 0, XL2)
                    acc = _two_steps(acc, words_a, x_a, k0, z_ptr, s_ptr, stride_sg, offs_zn,
                                     mask_zn, offs_cn, mask_cn, K, GROUP_SIZE, A_LAYOUT,
                                     B_LAYOUT, ORDER, WL1, XL1)
                    acc = _two_steps(acc, words_b, x_b, k0 + 2 * BLOCK_K, z_ptr, s_ptr,
                                     stride_sg, offs_zn, mask_zn, offs_cn, mask_cn, K,
                                     GROUP_SIZE, A_LAYOUT, B_LAYOUT, ORDER, WL1, XL1)
                else:
                    acc = _two_steps(acc, words, x, k0, z_ptr, s_ptr, stride_sg, offs_zn,
                                     mask_zn, offs_cn, mask_cn, K, GROUP_SIZE, A_LAYOUT,
                                     B_LAYOUT, ORDER, WL1, XL1)

        _store_out_t(acc, out_ptr, part_ptr, count_ptr, offs_cm, offs_cn,
                     (offs_cm < M)[None, :] & mask_cn[:, None], stride_om, M, N,
                     pid_m, pid_n, pid_k, SPLIT, HAS_SPLIT)

    @gluon.jit
    def _store_out_t(acc, out_ptr, part_ptr, count_ptr, offs_cm, offs_cn, out_mask,
                     stride_om, M, N, pid_m, pid_n, pid_k, SPLIT, HAS_SPLIT: gl.constexpr):
        """Store acc (out^T: [columns, rows]) as bf16 out[rows, columns]; with split K,
        this program's fp32 partials to part_ptr [SPLIT, M, N] instead, and the last
        split of the tile (one counter per row block x column block, grid axis 0 the
        column blocks) sums them in split order, stores out and resets the counter."""
        out_ptrs = out_ptr + offs_cm[None, :] * stride_om + offs_cn[:, None]
        if not HAS_SPLIT:
            gl.store(out_ptrs, acc.to(gl.bfloat16), mask=out_mask)
        else:
            part_ptrs = part_ptr + offs_cm[None, :] * N + offs_cn[:, None]
            gl.store(part_ptrs + pid_k * M * N, acc, mask=out_mask)
            gl.thread_barrier()  # every thread's partials are stored before the count
            tile = pid_m * gl.num_programs(0) + pid_n
            done = gl.atomic_add(count_ptr + tile, 1)
            if done == SPLIT - 1:
                total = gl.zeros_like(acc)
                for sk in range(SPLIT):
                    total += gl.load(part_ptrs + sk * M * N, mask=out_mask, other=0.0,
                                     cache_modifier=".cg")
                gl.store(out_ptrs, total.to(gl.bfloat16), mask=out_mask)
                gl.store(count_ptr + tile, 0)

    @gluon.constexpr_function
    def _min(a, b):
        return min(a, b)

    @gluon.constexpr_function
    def _x_row_padding(block_k):
        """Padding after each row of x^T's shared tile (one row of x, BLOCK_K values): 32
        values (64 bytes), so that the two rows of x an MMA quarter-warp reads land in
        different halves of the 32 banks (16-byte loads, 8 lanes at a time); 8 values for
        rows shorter than 64, where that no longer holds for every pair."""
        return 32 if block_k >= 64 else 8

    @gluon.jit
    def _load_x(x_ptrs, k0, offs_k, mask_m, K, EVEN: gl.constexpr):
        """The x^T tile of rows k0.. (physical order); rows past M or K read as 0."""
        if EVEN:
            return gl.load(x_ptrs + k0, mask=mask_m[None, :], other=0.0)
        return gl.load(x_ptrs + k0, mask=mask_m[None, :] & (k0 + offs_k < K)[:, None], other=0.0)

    @gluon.jit
    def _load_words(w_ptrs, offset, rows, mask_n, K, EVEN: gl.constexpr):
        """The word tile at ``offset``; past K or N (unless EVEN) words read as 0."""
        if EVEN:
            return gl.load(w_ptrs + offset)
        return gl.load(w_ptrs + offset, mask=(rows * 8 < K)[None, :] & mask_n[:, None], other=0)


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
    config = config or pick_mma_config(m, n, k, group_size, sm_count(x))
    if group_size < k and group_size % config.block_k:
        raise ValueError(f"block_k {config.block_k} does not divide the group size {group_size}")
    if config.load_steps not in (1, 2, 4) or config.prefetch not in (0, 1):
        raise ValueError(f"MmaConfig takes load_steps 1, 2 or 4 and prefetch 0 or 1; got "
                         f"load_steps={config.load_steps}, prefetch={config.prefetch}")
    block_m = min(config.max_block_m, 8 if m <= 8 else (16 if m <= 16 else
                                                        (32 if m <= 32 else 64)))
    block_m = max(block_m, 8 * config.warps_m)  # each row warp takes at least one n8 block
    splits, k_split = even_split(k, config.block_k * config.load_steps, config.split_k)
    blocks = -(-n // config.block_n)
    m_blocks = -(-m // block_m)
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if splits > 1:
        partials = torch.empty((splits, m, n), dtype=torch.float32, device=x.device)
        counters = split_counters(x.device, blocks * m_blocks)
    else:
        partials = counters = out  # unused
    _w4_mma_kernel[(blocks, splits, m_blocks)](
        x, packed, scales, zeros, out, partials, counters,
        m, n, k, k_split, x.stride(0), packed.stride(0), scales.stride(0), out.stride(0),
        GROUP_SIZE=min(group_size, k), BLOCK_M=block_m, BLOCK_N=config.block_n,
        BLOCK_K=config.block_k, SPLIT=splits, HAS_SPLIT=splits > 1,
        NUM_WARPS=config.num_warps, WARPS_M=config.warps_m, PREFETCH=config.prefetch,
        X_SHARED=config.x_shared, LOAD_STEPS=config.load_steps,
        VECTOR_COLUMNS=config.vector_columns,
        EVEN=k % k_split == 0 and n % config.block_n == 0, num_warps=config.num_warps,
    )
    return out
