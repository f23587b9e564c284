"""W4A16 GEMV for one row (decode at batch 1) with packed bf16x2 / f16x2 arithmetic.

Same weight layout as ``tamis.kernels.w4a16`` (8 codes per int32 word along K, code j of
word r is row k = 8r + j at bits [4j, 4j + 4)); no repacking. What differs from
``tamis.kernels.w4a16_gemv`` is the work per weight. For every word, one inline-PTX block
(``_WORD_DOT``) does::

    v_j = lop3(word >> 4j, 0x000F000F, MAGIC)     # j = 0..3: codes j and j+4 as the halves
                                                    # of a bf16x2 (f16x2) MAGIC + q, exact
    v_j = fma(v_j, 1, -MAGIC)                      # q_j, q_{j+4} exactly
    acc = fma(v_j, (x_j, x_{j+4}), acc)            # packed: two products per instruction
    out = float(acc.lo) + float(acc.hi)            # the word's sum_k x_k q_k in fp32

(MAGIC = 128 for bf16, whose 7 mantissa bits hold a code at bits 0..3; 1024 for f16),
about 18 instructions per 8 weights where the fp32 path needs ~3 per weight. The x pairs
(x_j, x_{j+4}) are built once per word row per thread from x viewed as int32 pairs, the
group scale multiplies each word's fp32 sum, and the zero point comes in once per tile
as ``- s * z * sum_k x_k`` (exact for any float zero point). The four products of a word
are summed in bf16 (f16) before the fp32 accumulation: with bf16 that adds a relative
error of about 2**-8 of a word's sum (the bf16 output rounds at 2**-9).

Inline PTX cannot run under the Triton interpreter: with ``use_asm=False`` the same
kernel computes each word's sum with plain fp32 Triton ops (same indexing, pairing and
reduction), which is what CPU tests run; the PTX is checked on the GPU (gpu-marked test).

Needs: M = 1, 4-bit codes, K a multiple of 8, x bf16 or fp16 and contiguous, each tile of
8 * block_kw rows inside one group (``packed_gemv_supported``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from tamis.kernels.splitk import even_split, sm_count, split_buffers

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs without triton
    triton = None


@dataclass(frozen=True)
class PackedGemvConfig:
    block_n: int = 256    # output columns per program
    block_kw: int = 16    # word rows per step (8 * block_kw rows of K, inside one group)
    split_k: int = 8      # programs along K per column block (reduced in the same launch)
    num_warps: int = 4
    prefetch: bool = True  # load the next tile of words before this one's arithmetic


def _word_dot_asm(bf16: bool) -> str:
    """PTX for one word: $0 (f32) = sum_j x_j q_j; $1 the word; $2..$5 the (x_j, x_{j+4})
    pairs as bf16x2 / f16x2 bits."""
    magic, one, neg = ("0x43004300", "0x3F803F80", "0xC300C300") if bf16 else \
        ("0x64006400", "0x3C003C00", "0xE400E400")
    ty = "bf16x2" if bf16 else "f16x2"
    if bf16:  # bf16 -> f32 is a 16-bit shift
        to_f32 = ("shl.b32 lo, acc, 16;\n and.b32 hi, acc, 0xFFFF0000;\n"
                  " add.f32 $0, lo, hi;")
    else:
        to_f32 = ("mov.b32 {h0, h1}, acc;\n cvt.f32.f16 lo, h0;\n cvt.f32.f16 hi, h1;\n"
                  " add.f32 $0, lo, hi;")
    return f"""{{
 .reg .b32 t1, t2, t3, v0, v1, v2, v3, acc, one, neg, zero;
 .reg .f32 lo, hi;
 .reg .b16 h0, h1;
 mov.b32 one, {one};
 mov.b32 neg, {neg};
 mov.b32 zero, 0;
 shr.u32 t1, $1, 4;
 shr.u32 t2, $1, 8;
 shr.u32 t3, $1, 12;
 lop3.b32 v0, $1, 0x000F000F, {magic}, 0xEA;
 lop3.b32 v1, t1, 0x000F000F, {magic}, 0xEA;
 lop3.b32 v2, t2, 0x000F000F, {magic}, 0xEA;
 lop3.b32 v3, t3, 0x000F000F, {magic}, 0xEA;
 fma.rn.{ty} v0, v0, one, neg;
 fma.rn.{ty} v1, v1, one, neg;
 fma.rn.{ty} v2, v2, one, neg;
 fma.rn.{ty} v3, v3, one, neg;
 fma.rn.{ty} acc, v0, $2, zero;
 fma.rn.{ty} acc, v1, $3, acc;
 fma.rn.{ty} acc, v2, $4, acc;
 fma.rn.{ty} acc, v3, $5, acc;
 {to_f32}
}}"""


WORD_DOT_BF16 = _word_dot_asm(True)
WORD_DOT_F16 = _word_dot_asm(False)


def packed_gemv_supported(m: int, k: int, group_size: int, bits: int,
                          dtype: torch.dtype) -> bool:
    """M = 1, 4-bit, K a multiple of 8, bf16/fp16 activations, groups of >= 4 words."""
    return (m == 1 and bits == 4 and k % 8 == 0
            and dtype in (torch.bfloat16, torch.float16)
            and (group_size % 32 == 0 or group_size >= k))


def pick_packed_gemv_config(n: int, k: int, num_sms: int = 132) -> PackedGemvConfig:
    """The fastest tiles of the sweeps (bench/results/quant.md): 256 columns x 16 word rows,
    or 512 x 8 once N alone gives many column blocks (4096x28672); K split (powers of
    two, at most 16) until there are at least 2 programs per SM."""
    block_n, block_kw = (512, 8) if n >= 64 * num_sms else (256, 16)
    blocks = -(-n // block_n)
    split = 1
    while blocks * split < 2 * num_sms and split < 16:
        split *= 2
    return PackedGemvConfig(block_n, block_kw, split, 4, True)


if triton is not None:

    @triton.jit
    def _word_dot(words, p0, p1, p2, p3, USE_ASM: tl.constexpr, BF16: tl.constexpr,
                  ASM: tl.constexpr):
        """sum_j x_j q_j of each word (see the module docstring), fp32."""
        if USE_ASM:
            return tl.inline_asm_elementwise(ASM, "=f,r,r,r,r,r", [words, p0, p1, p2, p3],
                                             dtype=tl.float32, is_pure=True, pack=1)
        total = tl.zeros(words.shape, dtype=tl.float32)
        for j in tl.static_range(4):
            if j == 0:
                p = p0
            elif j == 1:
                p = p1
            elif j == 2:
                p = p2
            else:
                p = p3
            lo = (words >> (4 * j)) & 0xF
            hi = (words >> (4 * j + 16)) & 0xF
            if BF16:
                x_lo = (p << 16).to(tl.float32, bitcast=True)
                x_hi = (p & -65536).to(tl.float32, bitcast=True)
            else:
                x_lo = (p & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
                x_hi = ((p >> 16) & 0xFFFF).to(tl.int16).to(tl.float16,
                                                             bitcast=True).to(tl.float32)
            total += x_lo * lo.to(tl.float32) + x_hi * hi.to(tl.float32)
        return total

    @triton.jit
    def _w4_gemv_packed_kernel(
        x_ptr, xw_ptr, qw_ptr, s_ptr, z_ptr, out_ptr, part_ptr, count_ptr,
        N, K, K_SPLIT, stride_qk, stride_sg,
        GROUP_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_KW: tl.constexpr,
        SPLIT, HAS_SPLIT: tl.constexpr, EVEN_N: tl.constexpr, EVEN_K: tl.constexpr,
        PREFETCH: tl.constexpr, USE_ASM: tl.constexpr, BF16: tl.constexpr,
        ASM: tl.constexpr,
    ):
        BLOCK_K: tl.constexpr = BLOCK_KW * 8
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        mask_n = offs_n < N
        offs_w = tl.arange(0, BLOCK_KW)
        offs_x = tl.arange(0, BLOCK_K)
        acc = tl.zeros((BLOCK_KW, BLOCK_N), dtype=tl.float32)
        corr = tl.zeros((BLOCK_N,), dtype=tl.float32)
        k_lo = pid_k * K_SPLIT
        k_hi = tl.minimum(k_lo + K_SPLIT, K)
        if PREFETCH:
            ahead = tl.load(qw_ptr + (k_lo // 8 + offs_w)[:, None] * stride_qk
                            + offs_n[None, :], mask=mask_n[None, :], other=0)
        for k0 in tl.range(k_lo, k_hi, BLOCK_K, num_stages=1):
            rows = k0 // 8 + offs_w
            if PREFETCH:
                # The next tile; the last step reloads its own (no row mask needed then).
                words = ahead
                nxt = tl.minimum(k0 + BLOCK_K, k_hi - BLOCK_K) // 8 + offs_w
                if EVEN_N:
                    ahead = tl.load(qw_ptr + nxt[:, None] * stride_qk + offs_n[None, :])
                else:
                    ahead = tl.load(qw_ptr + nxt[:, None] * stride_qk + offs_n[None, :],
                                    mask=mask_n[None, :], other=0)
            elif EVEN_K and EVEN_N:
                words = tl.load(qw_ptr + rows[:, None] * stride_qk + offs_n[None, :])
            else:
                words = tl.load(qw_ptr + rows[:, None] * stride_qk + offs_n[None, :],
                                mask=(rows[:, None] * 8 < k_hi) & mask_n[None, :], other=0)
            # x as int32 pairs: word row r holds x[8r..8r+7] in xw[4r..4r+3].
            if EVEN_K:
                xa = tl.load(xw_ptr + rows * 4)
                xb = tl.load(xw_ptr + rows * 4 + 1)
                xc = tl.load(xw_ptr + rows * 4 + 2)
                xd = tl.load(xw_ptr + rows * 4 + 3)
            else:
                rmask = rows * 8 < k_hi
                xa = tl.load(xw_ptr + rows * 4, mask=rmask, other=0)
                xb = tl.load(xw_ptr + rows * 4 + 1, mask=rmask, other=0)
                xc = tl.load(xw_ptr + rows * 4 + 2, mask=rmask, other=0)
                xd = tl.load(xw_ptr + rows * 4 + 3, mask=rmask, other=0)
            p0 = (xa & 0xFFFF) | (xc << 16)           # (x0, x4)
            p1 = ((xa >> 16) & 0xFFFF) | (xc & -65536)  # (x1, x5)
            p2 = (xb & 0xFFFF) | (xd << 16)           # (x2, x6)
            p3 = ((xb >> 16) & 0xFFFF) | (xd & -65536)  # (x3, x7)
            g = k0 // GROUP_SIZE  # the whole tile lies in one group
            if EVEN_N:
                s = tl.load(s_ptr + g * stride_sg + offs_n).to(tl.float32)
            else:
                s = tl.load(s_ptr + g * stride_sg + offs_n, mask=mask_n, other=0.0).to(tl.float32)
            dots = _word_dot(words, p0[:, None], p1[:, None], p2[:, None], p3[:, None],
                             USE_ASM, BF16, ASM)
            acc += dots * s[None, :]
        # The zero points: - sum_tiles s * z * sum(x over the tile), in a second pass so
        # that the main loop holds no block-wide reduction (no barriers between its loads).
        for k0 in range(k_lo, k_hi, BLOCK_K):
            g = k0 // GROUP_SIZE
            xt = tl.load(x_ptr + k0 + offs_x, mask=k0 + offs_x < k_hi, other=0.0)
            s = tl.load(s_ptr + g * stride_sg + offs_n, mask=mask_n, other=0.0).to(tl.float32)
            z = tl.load(z_ptr + g * stride_sg + offs_n, mask=mask_n, other=0.0).to(tl.float32)
            corr += s * z * tl.sum(xt.to(tl.float32), axis=0)
        col = tl.sum(acc, axis=0) - corr
        if not HAS_SPLIT:
            tl.store(out_ptr + offs_n, col.to(out_ptr.dtype.element_ty), mask=mask_n)
        else:
            tl.store(part_ptr + pid_k * N + offs_n, col, mask=mask_n)
            tl.debug_barrier()  # every thread's partials are stored before the count
            done = tl.atomic_add(count_ptr + pid_n, 1)
            if done == SPLIT - 1:
                total = tl.zeros((BLOCK_N,), dtype=tl.float32)
                for sk in range(SPLIT):
                    total += tl.load(part_ptr + sk * N + offs_n, mask=mask_n, other=0.0,
                                     cache_modifier=".cg")
                tl.store(out_ptr + offs_n, total.to(out_ptr.dtype.element_ty), mask=mask_n)
                tl.store(count_ptr + pid_n, 0)


def _block_kw(config: PackedGemvConfig, k: int, group_size: int) -> int:
    """The config's word rows, shrunk (powers of two) until a tile lies inside one group."""
    kw = config.block_kw
    while kw > 1 and group_size < k and group_size % (8 * kw) != 0:
        kw //= 2
    return kw


def w4a16_gemv_packed(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                      zeros: torch.Tensor, group_size: int, bits: int = 4,
                      config: PackedGemvConfig | None = None,
                      use_asm: bool | None = None) -> torch.Tensor:
    """``w4a16_gemm_ref`` (same contract) for x [1, K] (``packed_gemv_supported``).
    ``use_asm`` defaults to True on CUDA (the PTX) and False on CPU (the interpreter)."""
    if triton is None:
        raise RuntimeError("w4a16_gemv_packed needs triton installed")
    m, k = x.shape
    n = qweight.shape[1]
    if not packed_gemv_supported(m, k, group_size, bits, x.dtype):
        raise ValueError(f"packed GEMV takes M = 1, 4 bits, K % 8 == 0, bf16/fp16 x and "
                         f"groups of whole 4-word blocks; got M={m}, K={k}, {bits} bits, "
                         f"group {group_size}, {x.dtype}")
    x = x.contiguous()
    use_asm = x.is_cuda if use_asm is None else use_asm
    config = config or pick_packed_gemv_config(n, k, sm_count(x))
    block_kw = _block_kw(config, k, group_size)
    block_k = 8 * block_kw
    splits, k_split = even_split(k, block_k, config.split_k)
    blocks = triton.cdiv(n, config.block_n)
    even_k = k % k_split == 0 and k_split % block_k == 0
    even_n = n % config.block_n == 0
    prefetch = config.prefetch and even_k  # it loads whole tiles: K must split evenly
    out = torch.empty((1, n), dtype=x.dtype, device=x.device)
    partials, counters = split_buffers(out, splits, (n,), blocks)
    bf16 = x.dtype == torch.bfloat16
    _w4_gemv_packed_kernel[(blocks, splits)](
        x, x.view(torch.int32), qweight, scales, zeros, out, partials, counters,
        n, k, k_split, qweight.stride(0), scales.stride(0),
        GROUP_SIZE=group_size, BLOCK_N=config.block_n, BLOCK_KW=block_kw,
        SPLIT=splits, HAS_SPLIT=splits > 1, EVEN_N=even_n, EVEN_K=even_k,
        PREFETCH=prefetch, USE_ASM=use_asm, BF16=bf16,
        ASM=WORD_DOT_BF16 if bf16 else WORD_DOT_F16,
        num_warps=config.num_warps, num_stages=1,
    )
    return out
