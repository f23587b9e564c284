"""W8A8 FP8 GEMM for decode batches on Hopper: per-token activation scales, per-channel
weight scales.

```
a        float8_e4m3fn [M, K]   (per_token_quant_fp8's codes)
b        float8_e4m3fn [N, K]   (the layer's weight, K contiguous: the MMA's K-major B)
a_scale  float32 [M]            b_scale float32 [N]
out[m, n] = (sum_k a[m, k] * b[n, k]) * a_scale[m] * b_scale[n]   (+ bias[n])
```

Why not ``torch._scaled_mm`` at these sizes. At 64 rows cuBLASLt's row-wise scaled FP8
GEMM ran one 128 x 128 tile shape on every Llama-3.1-8B layer (an H100's decode profile),
so a layer of N = 4096 columns had 32 programs for 132 multiprocessors, and the step is
bound by how fast 32 of them can stream the weight. Here a program takes 64 rows (Hopper's warpgroup
MMA height) and the widest of 128 / 64 / 32 columns that still gives about one program a
multiprocessor (``fp8_mm_tiles``). Measured at 64 rows on an H100 against cuBLASLt, the four
layer shapes (K x N 4096 x 6144, 4096 x 4096, 4096 x 28672, 14336 x 4096): 11.9 / 9.1 / 43.9
/ 24.3 us against 15.3 / 14.1 / 49.6 / 38.2 us, and vLLM's CUTLASS kernel 12.3 / 9.2 / 46.7 /
24.2 us. From 256 rows cuBLASLt's larger tiles tie or win, so ``kernels.fp8.fp8_linear``
sends only ``FP8_MM_ROWS`` here: from 33 rows (where a 64-row tile is at least half used,
and the measured 64-row case stands) to 128.

On the CPU the kernel runs under Triton's interpreter, whose ``tl.dot`` takes the same
codes as float32 values (the tests); ``fp8_linear_ref`` in ``kernels.fp8`` is the
reference.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from tamis.kernels._triton import kernel, triton_available
from tamis.kernels.splitk import sm_count

if triton_available():
    import triton.language as tl

FP8_MM_ROWS = range(33, 129)   # rows fp8_linear sends here on Hopper; cuBLASLt outside


@dataclass(frozen=True)
class Fp8MmTiles:
    block_m: int
    block_n: int
    block_k: int
    stages: int
    num_warps: int = 4


def fp8_mm_tiles(m: int, n: int, k: int, num_sms: int) -> Fp8MmTiles:
    """Tiles for an [m, k] x [k, n] product: 64 rows a program; the widest of 128 / 64 / 32
    columns whose grid still has 0.7 programs a multiprocessor (narrower tiles would split
    each weight row's stream for no more parallelism); K steps of 256 bytes five deep for
    the narrow tiles, 128 three deep for the 128-column ones (which the shared memory
    limits). These are the best tiles of a sweep at 64 rows on an H100 for each
    Llama-3.1-8B layer shape (within 0.4 us of it at 128 rows)."""
    row_tiles = -(-m // 64)
    block_n = 32
    for width in (128, 64):
        if row_tiles * -(-n // width) >= 0.7 * num_sms:
            block_n = width
            break
    if block_n == 128:
        return Fp8MmTiles(64, 128, 128, 3)
    return Fp8MmTiles(64, block_n, 256 if k >= 256 else 128, 5)


@kernel
def _fp8_mm_kernel(a_ptr, b_ptr, out_ptr, a_scale_ptr, b_scale_ptr, bias_ptr, M, N, K,
                   stride_am, stride_bn, stride_om,
                   HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr):
    """One [BLOCK_M, BLOCK_N] tile of ``out`` over the whole of K (module table)."""
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m = offs_m < M
    mask_n = offs_n < N
    # Rows past M or N load row 0 / column 0 again (in bounds) and are never stored: the
    # loads of full K steps then carry no mask at all.
    rows = tl.where(mask_m, offs_m, 0)
    cols = tl.where(mask_n, offs_n, 0)
    a_ptrs = a_ptr + rows[:, None] * stride_am + offs_k[None, :]
    b_ptrs = b_ptr + cols[None, :] * stride_bn + offs_k[:, None]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in tl.range(0, K, BLOCK_K, num_stages=STAGES):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            in_k = k0 + offs_k < K
            a = tl.load(a_ptrs, mask=in_k[None, :], other=0.0)
            b = tl.load(b_ptrs, mask=in_k[:, None], other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    a_s = tl.load(a_scale_ptr + rows)
    b_s = tl.load(b_scale_ptr + cols)
    out = acc * a_s[:, None] * b_s[None, :]
    if HAS_BIAS:
        out += tl.load(bias_ptr + cols).to(tl.float32)[None, :]
    tl.store(out_ptr + offs_m[:, None] * stride_om + offs_n[None, :],
             out.to(out_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


def fp8_mm_triton(a: torch.Tensor, b: torch.Tensor, a_scale: torch.Tensor,
                  b_scale: torch.Tensor, out_dtype: torch.dtype,
                  bias: torch.Tensor | None = None,
                  tiles: Fp8MmTiles | None = None) -> torch.Tensor:
    """The module table's product: a [M, K] and b [N, K] (e4m3 codes on the GPU; the same
    values in float32 under the interpreter), a_scale [M] or [M, 1], b_scale [N]; returns
    [M, N] in ``out_dtype``. ``tiles`` default to ``fp8_mm_tiles``."""
    m, k = a.shape
    n = b.shape[0]
    if b.shape[1] != k:
        raise ValueError(f"fp8_mm: a is [{m}, {k}] but b is {list(b.shape)}")
    if tiles is None:
        tiles = fp8_mm_tiles(m, n, k, sm_count(a))
    a, b = a.contiguous(), b.contiguous()
    a_scale = a_scale.float().reshape(m).contiguous()
    b_scale = b_scale.float().reshape(n).contiguous()
    out = torch.empty((m, n), dtype=out_dtype, device=a.device)
    grid = (-(-n // tiles.block_n), -(-m // tiles.block_m))
    _fp8_mm_kernel[grid](a, b, out, a_scale, b_scale, b_scale if bias is None else bias,
                         m, n, k, a.stride(0), b.stride(0), out.stride(0),
                         HAS_BIAS=bias is not None, EVEN_K=k % tiles.block_k == 0,
                         BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n,
                         BLOCK_K=tiles.block_k, STAGES=tiles.stages,
                         num_warps=tiles.num_warps)
    return out
