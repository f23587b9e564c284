"""Device helpers of the two W4A16 tensor-core kernels that read the interleaved words
(``tamis.kernels.w4a16_mma``: ``mma.sync``; ``tamis.kernels.w4a16_wgmma``: Hopper's
``wgmma``). Both take the weight as the MMA's A operand, whose register fragment is the
same in the two instructions (per warp 16 output columns x 16 rows of K), so the same
word layout, unpack and K permutation serve both (Gluon, explicit layouts).

The contract (``tamis.kernels.w4a16_mma``'s docstring has the derivation):
- words [BLOCK_N, BLOCK_K / 8] load in ``word_layout(A layout, order)``: each thread's
  words hold exactly the codes of its fragments; ``unpack_tile`` (or
  ``unpack_tile_scaled``, or ``unpack_tile_offset`` for codes left as 128 + q) turns
  them into the A operand with no data movement;
- inside each 32-row block of K, logical row k' is physical row ``pi(k')`` (k' bits 0, 3,
  4 -> bits 0, 1, 2; k' bits 1, 2 -> bits 3, 4): x^T must be read in that order
  (``x_tile_layout`` / ``logical_x`` in registers, ``physical_rows`` for a gather);
- output columns may be permuted (``column_order``): results are stored at
  ``physical_columns``;
- ``store_out_t`` stores out^T tiles, with the split-K reduction of
  ``tamis.kernels.splitk`` (summed by the last split to arrive, or always by the last
  split, its partials then optionally in thread order).
"""
from __future__ import annotations

from tamis.kernels._gluon import gluon

if gluon is not None:
    from tamis.kernels._gluon import gl, thread_barrier

    # Per word: $8 the word, $9 the column's -(128 + z) twice as bf16x2; $0..$7 the
    # (lo, hi) halves of v_0..v_3 = (q - z), bf16 (nz, -0.0 twice, serves the scaled
    # variant below; unused here).
    _UNPACK_TEMPLATE = """{
 .reg .b32 t1, t2, t3, v0, v1, v2, v3, one, nz;
 mov.b32 one, 0x3F803F80;
 mov.b32 nz, 0x80008000;
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
    # The same, then v_j * s with $10 the column's scale twice: ((q - z) * s), rounded
    # once to bf16.
    _UNPACK_SCALED_TEMPLATE = _UNPACK_TEMPLATE.replace(
        " mov.b32 {$0, $1}, v0;",
        "".join(f" fma.rn.bf16x2 v{j}, v{j}, $10, nz;\n" for j in range(4))
        + " mov.b32 {$0, $1}, v0;")
    _UNPACK = gl.constexpr(_UNPACK_TEMPLATE)
    _UNPACK_SCALED = gl.constexpr(_UNPACK_SCALED_TEMPLATE)
    # Per word: $4 the word; $0..$3 v_0..v_3 = (128 + q_j, 128 + q_{j+4}) as bf16x2, the
    # codes offset by 128 and no zero point (``unpack_tile_offset``). 32-bit outputs: as
    # 16-bit halves ptxas would move each into the MMA's register quad.
    _UNPACK_OFFSET = gl.constexpr("""{
 .reg .b32 t1, t2, t3;
 shr.u32 t1, $4, 4;
 shr.u32 t2, $4, 8;
 shr.u32 t3, $4, 12;
 lop3.b32 $0, $4, 0x000F000F, 0x43004300, 0xEA;
 lop3.b32 $1, t1, 0x000F000F, 0x43004300, 0xEA;
 lop3.b32 $2, t2, 0x000F000F, 0x43004300, 0xEA;
 lop3.b32 $3, t3, 0x000F000F, 0x43004300, 0xEA;
}""")

    @gluon.jit
    def as_bf16x2(v):
        """Float values -> their bf16 bits twice in one int32 (the (lo, hi) of a bf16x2)."""
        bits = v.to(gl.bfloat16).to(gl.int16, bitcast=True).to(gl.int32) & 0xFFFF
        return bits | (bits << 16)

    @gluon.constexpr_function
    def column_order(a_layout, vector_columns):
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
    def word_layout(a_layout, order):
        """The layout of the word tile [BLOCK_N, BLOCK_K / 8] (physical columns) whose
        unpacked codes, columns permuted to logical order (``logical_columns``), land in
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
        order = plain_order(order)
        nb = len(order)
        return tuple(nb - 1 - order[j] for j in reversed(range(nb))) + (nb,)

    @gluon.constexpr_function
    def plain_order(order):
        """A column order as Python ints (a constexpr tuple passed on to a jitted function
        arrives with its items wrapped)."""
        return tuple(getattr(v, "value", v) for v in getattr(order, "value", order))

    @gluon.constexpr_function
    def _bit_shape(order, rest):
        """[2] per column bit, then ``rest``."""
        return [2] * len(plain_order(order)) + [rest]

    @gluon.constexpr_function
    def _bit_count(order):
        return len(plain_order(order))

    @gluon.jit
    def logical_columns(t, ORDER: gl.constexpr):
        """t [BLOCK_N, R], rows in physical column order -> rows in logical order."""
        BN: gl.constexpr = t.shape[0]
        R: gl.constexpr = t.shape[1]
        u = gl.reshape(t, _bit_shape(ORDER, R))
        u = gl.permute(u, _column_permutation(ORDER).value)
        return gl.reshape(u, [BN, R])

    @gluon.jit
    def physical_columns(local, ORDER: gl.constexpr):
        """Logical columns 0..BLOCK_N-1 of a tile -> their physical columns."""
        col = gl.zeros_like(local)
        for j in gl.static_range(_bit_count(ORDER)):
            col |= ((local >> j) & 1) << ORDER[j]
        return col

    @gluon.constexpr_function
    def x_tile_layout(b_layout):
        """The layout of the x^T tile [BLOCK_K, BLOCK_M] in physical row order whose
        permutation to logical order (``logical_x``) is ``b_layout`` (the B operand's
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

    @gluon.constexpr_function
    def x_word_layout(x_layout):
        """``x_tile_layout`` of bf16 pairs: the layout of [BLOCK_K / 2, BLOCK_M] int32 whose
        halves are physical rows 2i and 2i + 1 of ``x_layout`` (its first register basis
        is row 1)."""
        assert x_layout.reg_bases[0] == [1, 0]
        def half(bases):
            return [[k >> 1, m] for k, m in bases]
        return gl.DistributedLinearLayout(
            reg_bases=half(x_layout.reg_bases[1:]), lane_bases=half(x_layout.lane_bases),
            warp_bases=half(x_layout.warp_bases), block_bases=[],
            shape=[x_layout.shape[0] // 2, x_layout.shape[1]])

    @gluon.jit
    def logical_x(x, B_LAYOUT: gl.constexpr):
        """x^T [BLOCK_K, BLOCK_M] in physical row order -> logical order, in B_LAYOUT."""
        BK: gl.constexpr = x.shape[0]
        BM: gl.constexpr = x.shape[1]
        t = gl.reshape(x, [BK // 32, 2, 2, 2, 2, 2, BM])  # physical bits 4, 3, 2, 1, 0
        t = gl.permute(t, [0, 3, 4, 1, 2, 5, 6])            # k' bits 4, 3, 2, 1, 0
        t = gl.reshape(t, [BK, BM])
        return gl.convert_layout(t, B_LAYOUT, assert_trivial=True)

    @gluon.jit
    def unpack_tile(words, nzz, A_LAYOUT: gl.constexpr, ORDER: gl.constexpr):
        """Words [BLOCK_N, BLOCK_K / 8] (physical columns) -> (q - z) [BLOCK_N, BLOCK_K]
        (bf16, logical columns) in A_LAYOUT."""
        o0, o1, o2, o3, o4, o5, o6, o7 = gl.inline_asm_elementwise(
            _UNPACK, "=h,=h,=h,=h,=h,=h,=h,=h,r,r", [words, nzz],
            dtype=(gl.bfloat16,) * 8, is_pure=True, pack=1)
        return _codes_to_operand(o0, o1, o2, o3, o4, o5, o6, o7, A_LAYOUT, ORDER)

    @gluon.jit
    def unpack_tile_scaled(words, nzz, ss, A_LAYOUT: gl.constexpr, ORDER: gl.constexpr):
        """``unpack_tile`` times the group scale: ((q - z) * s), each rounded once to
        bf16 (``ss`` the column's scale twice as bf16x2)."""
        o0, o1, o2, o3, o4, o5, o6, o7 = gl.inline_asm_elementwise(
            _UNPACK_SCALED, "=h,=h,=h,=h,=h,=h,=h,=h,r,r,r", [words, nzz, ss],
            dtype=(gl.bfloat16,) * 8, is_pure=True, pack=1)
        return _codes_to_operand(o0, o1, o2, o3, o4, o5, o6, o7, A_LAYOUT, ORDER)

    @gluon.jit
    def unpack_tile_offset(words, A_LAYOUT: gl.constexpr, ORDER: gl.constexpr):
        """Words [BLOCK_N, BLOCK_K / 8] (physical columns) -> 128 + q [BLOCK_N, BLOCK_K]
        (bf16, exact; logical columns) in A_LAYOUT: ``unpack_tile`` without the zero
        point, which the caller subtracts after the MMA as (128 + z) times the sum of x."""
        v0, v1, v2, v3 = gl.inline_asm_elementwise(
            _UNPACK_OFFSET, "=r,=r,=r,=r,r", [words], dtype=(gl.int32,) * 4,
            is_pure=True, pack=1)
        o0, o1 = bf16_halves(v0)
        o2, o3 = bf16_halves(v1)
        o4, o5 = bf16_halves(v2)
        o6, o7 = bf16_halves(v3)
        return _codes_to_operand(o0, o1, o2, o3, o4, o5, o6, o7, A_LAYOUT, ORDER)

    @gluon.jit
    def bf16_halves(v):
        """The (low, high) bf16 halves of int32 v (no data moves)."""
        return (v.to(gl.int16).to(gl.bfloat16, bitcast=True),
                (v >> 16).to(gl.int16).to(gl.bfloat16, bitcast=True))

    @gluon.jit
    def _codes_to_operand(o0, o1, o2, o3, o4, o5, o6, o7, A_LAYOUT: gl.constexpr,
                          ORDER: gl.constexpr):
        """The 8 unpacked halves of each word [BLOCK_N, BLOCK_K / 8] -> the tile
        [BLOCK_N, BLOCK_K] in logical row and column order, in A_LAYOUT (no data moves)."""
        BN: gl.constexpr = o0.shape[0]
        KW: gl.constexpr = o0.shape[1]
        q0 = gl.join(gl.join(o0, o1), gl.join(o2, o3))
        q1 = gl.join(gl.join(o4, o5), gl.join(o6, o7))
        t = gl.join(q0, q1)                            # [BN, KW, h, j0, j1]
        t = gl.reshape(t, [BN, KW // 4, 4, 2, 2, 2])   # word row = 4 r_hi + r_lo
        t = gl.permute(t, [0, 1, 5, 4, 2, 3])          # k': r_hi, j1, j0, r_lo, h
        t = logical_columns(gl.reshape(t, [BN, KW * 8]), ORDER)
        return gl.convert_layout(t, A_LAYOUT, assert_trivial=True)

    @gluon.jit
    def physical_rows(k):
        """Logical row k' of a 32-row block -> its physical row (``tamis.kernels.w4a16_mma``:
        k' bits 0, 3, 4 -> bits 0, 1, 2 and k' bits 1, 2 -> bits 3, 4)."""
        return ((k & 1) | ((k >> 3) & 1) << 1 | ((k >> 4) & 1) << 2
                | ((k >> 1) & 1) << 3 | ((k >> 2) & 1) << 4 | (k >> 5) << 5)

    @gluon.jit
    def store_out_t(acc, out_ptr, part_ptr, count_ptr, offs_cm, offs_cn, out_mask,
                    stride_om, M, N, pid_m, pid_n, pid_k, SPLIT, HAS_SPLIT: gl.constexpr,
                    LAST_SPLIT_REDUCES: gl.constexpr = 0, LINEAR_PARTIALS: gl.constexpr = False,
                    NUM_WARPS: gl.constexpr = 4):
        """Store acc (out^T: [columns, rows]) as bf16 out[rows, columns]; with split K,
        through fp32 partials in part_ptr [SPLIT, M, N] and one counter per row block x
        column block (grid axis 0 the column blocks), summed in split order.

        Who sums: the last split of the tile to arrive (``_reduce_at_arrival``), or with
        ``LAST_SPLIT_REDUCES`` (the split count, a constexpr) always split SPLIT - 1
        (``_reduce_at_last_split``: no wait for the counter in the others, one round of
        loads; its unrolled loads cost registers)."""
        out_ptrs = out_ptr + offs_cm[None, :] * stride_om + offs_cn[:, None]
        if not HAS_SPLIT:
            gl.store(out_ptrs, acc.to(gl.bfloat16), mask=out_mask)
        else:
            part_ptrs = part_ptr + offs_cm[None, :] * N + offs_cn[:, None]
            tile = pid_m * gl.num_programs(0) + pid_n
            if LINEAR_PARTIALS:
                size: gl.constexpr = acc.shape[0] * acc.shape[1]
                if acc.shape[1] > 64:
                    # Rows of x in the next wgmma size (128): pointers formed after the
                    # sum; held across it, [BN, BM] 64-bit pointers took the tile from
                    # 174 to 216 registers (sm_90 builds). Narrower tiles keep the
                    # placement their timings were taken with.
                    out_ptrs = out_ptr
                _reduce_linear_at_last_split(acc, out_ptrs, offs_cm, offs_cn, stride_om,
                                             part_ptr + tile * (LAST_SPLIT_REDUCES * size),
                                             count_ptr + tile, out_mask, pid_k,
                                             LAST_SPLIT_REDUCES, NUM_WARPS)
            elif LAST_SPLIT_REDUCES:
                _reduce_at_last_split(acc, out_ptrs, part_ptrs, count_ptr + tile, out_mask,
                                      M, N, pid_k, LAST_SPLIT_REDUCES)
            else:
                _reduce_at_arrival(acc, out_ptrs, part_ptrs, count_ptr + tile, out_mask,
                                   M, N, pid_k, SPLIT)

    @gluon.jit
    def _reduce_at_arrival(acc, out_ptrs, part_ptrs, counter, out_mask, M, N, pid_k, SPLIT):
        """Every split stores its partials and counts itself in; the one that counts
        last sums all of them (its own reloaded), stores out and resets the counter."""
        gl.store(part_ptrs + pid_k * M * N, acc, mask=out_mask)
        thread_barrier()  # every thread's partials are stored before the count
        done = gl.atomic_add(counter, 1)
        if done == SPLIT - 1:
            total = gl.zeros_like(acc)
            for sk in range(SPLIT):
                total += gl.load(part_ptrs + sk * M * N, mask=out_mask, other=0.0,
                                 cache_modifier=".cg")
            gl.store(out_ptrs, total.to(gl.bfloat16), mask=out_mask)
            gl.store(counter, 0)

    @gluon.jit
    def _reduce_at_last_split(acc, out_ptrs, part_ptrs, counter, out_mask, M, N, pid_k,
                              SPLIT: gl.constexpr):
        """Splits 0 .. SPLIT - 2 store their partials and release-increment the counter
        (an atomic whose result nobody waits for); split SPLIT - 1 spins on it (acquire)
        until they all have, then loads their partials in one round, adds its own from
        registers last (the same sums, in the same order, as ``_reduce_at_arrival``),
        stores out and resets the counter.

        The spin relies on blocks starting in grid order, as split-K kernels that wait on
        earlier splits do (CUTLASS's serial split-K, Marlin's locks): split SPLIT - 1 of
        a tile is a later block than the others (grid axis 1 the splits), so they have
        started, and they wait on nothing."""
        if pid_k != SPLIT - 1:
            gl.store(part_ptrs + pid_k * M * N, acc, mask=out_mask)
            _release_partials(counter)
        else:
            _wait_for_partners(counter, SPLIT)
            total = gl.zeros_like(acc)
            for sk in gl.static_range(SPLIT - 1):
                total += gl.load(part_ptrs + sk * M * N, mask=out_mask, other=0.0,
                                 cache_modifier=".cg")
            gl.store(out_ptrs, (total + acc).to(gl.bfloat16), mask=out_mask)

    @gluon.jit
    def _release_partials(counter):
        """A partner split's count-in, once its partials are stored: a releasing atomic
        whose result it does not wait for."""
        thread_barrier()  # every thread's partials are stored before the release
        gl.atomic_add(counter, 1, sem="release")

    @gluon.jit
    def _wait_for_partners(counter, SPLIT: gl.constexpr):
        """The last split's spin (acquiring) until its SPLIT - 1 partners have counted
        in; then it puts the counter back to 0 for the next launch."""
        arrived = gl.atomic_add(counter, 0, sem="acquire")
        while arrived < SPLIT - 1:
            arrived = gl.atomic_add(counter, 0, sem="acquire")
        gl.store(counter, 0)

    @gluon.jit
    def _thread_linear(acc, NUM_WARPS: gl.constexpr):
        """An MMA accumulator [BN, BM] (``mma.sync`` m16n8 or ``wgmma`` [16, BM, 16]
        instructions, warps [NUM_WARPS, 1]: 16 rows a warp, 8 columns a lane quad)
        viewed as [chunks, threads, 4]: each thread's registers in runs of 4 along the
        last axis, the thread on the middle one. No data moves. Stored at offsets
        ``_linear_offsets`` of the view, a warp writes 512 contiguous bytes per run."""
        BN: gl.constexpr = acc.shape[0]
        BM: gl.constexpr = acc.shape[1]
        R: gl.constexpr = BN // (16 * NUM_WARPS)
        # rows: repeat, warp, r1 (+8), lane / 4; columns: chunk of 8, lane % 4, j (+1)
        t = gl.reshape(acc, [R, NUM_WARPS, 2, 8, BM // 8, 4, 2])
        t = gl.permute(t, [0, 4, 1, 3, 5, 2, 6])
        return gl.reshape(t, [R * (BM // 8), 32 * NUM_WARPS, 4])

    @gluon.jit
    def _from_thread_linear(view, acc, NUM_WARPS: gl.constexpr):
        """``_thread_linear``'s inverse: the view back in the shape and layout of acc."""
        BN: gl.constexpr = acc.shape[0]
        BM: gl.constexpr = acc.shape[1]
        R: gl.constexpr = BN // (16 * NUM_WARPS)
        t = gl.reshape(view, [R, BM // 8, NUM_WARPS, 8, 4, 2, 2])
        t = gl.permute(t, [0, 2, 5, 3, 1, 4, 6])
        return gl.convert_layout(gl.reshape(t, [BN, BM]), acc.type.layout,
                                 assert_trivial=True)

    @gluon.jit
    def _linear_offsets(view):
        """Element offsets of a [chunks, threads, 4] view, in its own layout."""
        V: gl.constexpr = view.type.layout
        D0: gl.constexpr = view.shape[0]
        T: gl.constexpr = view.shape[1]
        i0 = gl.arange(0, D0, layout=gl.SliceLayout(1, gl.SliceLayout(2, V)))
        i1 = gl.arange(0, T, layout=gl.SliceLayout(0, gl.SliceLayout(2, V)))
        i2 = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, V)))
        return (i0[:, None, None] * T + i1[None, :, None]) * 4 + i2[None, None, :]

    @gluon.jit
    def _reduce_linear_at_last_split(acc, out_ptrs, offs_cm, offs_cn, stride_om, tile_parts,
                                     counter, out_mask, pid_k, SPLIT: gl.constexpr,
                                     NUM_WARPS: gl.constexpr):
        """``_reduce_at_last_split`` with the partials in thread order: a tile's SPLIT
        partials at ``tile_parts`` (SPLIT x BN x BM fp32), each thread's registers stored
        and loaded as 16-byte vectors, every warp access contiguous (against scalar
        accesses 4 rows of out^T apart). Same additions, same order: bit-equal.
        out_ptrs: the output's pointers [BN, BM], or above 64 rows of x its base, the
        pointers then formed at the store."""
        view = _thread_linear(acc, NUM_WARPS)
        offs = _linear_offsets(view)
        size: gl.constexpr = acc.shape[0] * acc.shape[1]
        if pid_k != SPLIT - 1:
            gl.store(tile_parts + pid_k * size + offs, view)
            _release_partials(counter)
        else:
            _wait_for_partners(counter, SPLIT)
            total = gl.zeros_like(view)
            for sk in gl.static_range(SPLIT - 1):
                total += gl.load(tile_parts + sk * size + offs, cache_modifier=".cg")
            total = _from_thread_linear(total + view, acc, NUM_WARPS)
            ptrs = out_ptrs
            if acc.shape[1] > 64:
                ptrs = out_ptrs + offs_cm[None, :] * stride_om + offs_cn[:, None]
            gl.store(ptrs, total.to(gl.bfloat16), mask=out_mask)

    @gluon.constexpr_function
    def constexpr_min(a, b):
        return min(a, b)
