"""W4A16 (and W8A16) dequantize-GEMM: ``y = x @ dequant(qweight)``.

One weight layout serves AWQ, GPTQ (act-order included) and compressed-tensors; the
loaders in ``tamis.quant`` repack into it once after loading:

```
qweight  int32 [ceil(K / P), N]   P = 32 // bits values per word, packed along K,
                                  value j of word r is row k = P*r + j at bits [bits*j, bits*(j+1))
scales   [G, N]  fp16 or fp32     G = ceil(K / group_size); row k uses group k // group_size
zeros    [G, N]  like scales      the zero point as a float (AWQ/GPTQ integers, already
                                  corrected for GPTQ v1's "+1"), so w = (q - zero) * scale
```

Act-order (GPTQ ``desc_act``) is handled outside the kernel: the loader sorts K by
``g_idx`` so groups become contiguous, and the caller permutes x's columns with the
same permutation (``x[..., perm]``).

``w4a16_gemm_ref`` is the plain-torch reference. The GPU paths:

- ``w4a16_gemv_packed`` (M = 1, 4-bit, bf16/fp16 x; ``tamis.kernels.w4a16_gemv_packed``):
  inline PTX, two codes per bf16x2/f16x2 instruction, split-K reduced in the same launch.
- ``w4a16_gemv_triton`` (M = 1 otherwise, e.g. 8-bit or fp32 x; ``tamis.kernels.w4a16_gemv``):
  no tensor cores, fp32 arithmetic per weight.
- ``w4a16_gemm_triton``: tl.dot on a dequantized [BLOCK_K, BLOCK_N] tile, tile configs
  by M bucket (``pick_config``), split-K reduced in the same launch for small M.
- ``w4a16_gemm_dequant`` (M >= ``DEQUANT_MIN_M``): the dense weight
  (``tamis.kernels.wna16_dequant``), then cuBLAS.
- On interleaved words (``tamis.kernels.w4a16_mma``'s layout): ``w4a16_gemm_wgmma_tma``
  (Hopper wgmma fed by the TMA, 17..256 rows, from 9 on narrow layers;
  ``tamis.kernels.w4a16_wgmma_tma``),
  ``w4a16_gemm_wgmma`` (Hopper wgmma fed by cp.async, where the TMA kernel does not take
  the shape; ``tamis.kernels.w4a16_wgmma``) and ``w4a16_gemm_mma`` (mma.sync, up to
  ``MMA_DISPATCH_M`` rows).

``w4a16_gemm`` dispatches (those on CUDA, the reference elsewhere). On Hopper the two
tensor-core kernels launch with programmatic dependent launch (``tamis.kernels.pdl``):
their first weight loads overlap the kernel before them.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from tamis.kernels.splitk import sm_count, split_buffers
from tamis.kernels.w4a16_gemv import (  # noqa: F401  (re-exported)
    GEMV_MAX_M, GemvConfig, gemv_supported, pick_gemv_config, w4a16_gemv_triton)
from tamis.kernels.w4a16_gemv_packed import (  # noqa: F401  (re-exported)
    PackedGemvConfig, packed_gemv_supported, w4a16_gemv_packed)

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs without triton still get the reference
    triton = None


def code_shifts(bits: int, interleaved: bool = False) -> list[int]:
    """Bit offset of code j (row P*r + j) inside word r: ``bits * j``, or for
    ``interleaved`` 4-bit words (AWQ's nibble order 0, 2, 4, 6, 1, 3, 5, 7, the layout of
    ``tamis.kernels.w4a16_mma``) ``4 * (j // 2 + 4 * (j % 2))``."""
    if interleaved:
        if bits != 4:
            raise ValueError("interleaved words hold 4-bit codes")
        return [4 * (j // 2 + 4 * (j % 2)) for j in range(8)]
    return [bits * j for j in range(32 // bits)]


def dequantize_wna16(qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                     group_size: int, bits: int, in_features: int,
                     interleaved: bool = False) -> torch.Tensor:
    """The dense weight [K, N] in float32: (q - zero) * scale per group."""
    shifts = torch.tensor(code_shifts(bits, interleaved), dtype=torch.int32,
                          device=qweight.device)
    q = (qweight.unsqueeze(1) >> shifts[None, :, None]) & ((1 << bits) - 1)
    q = q.reshape(-1, qweight.shape[1])[:in_features]
    group = torch.arange(in_features, device=qweight.device) // group_size
    return (q.float() - zeros[group].float()) * scales[group].float()


def w4a16_gemm_ref(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                   zeros: torch.Tensor, group_size: int, bits: int = 4,
                   interleaved: bool = False) -> torch.Tensor:
    """x [M, K] -> [M, N] in x's dtype, through the dequantized weight."""
    weight = dequantize_wna16(qweight, scales, zeros, group_size, bits, x.shape[-1],
                              interleaved)
    return (x.float() @ weight).to(x.dtype)


@dataclass(frozen=True)
class GemmConfig:
    block_m: int
    block_n: int
    block_k: int
    split_k: int
    num_warps: int
    num_stages: int
    unpack_once: bool = False  # load each word once and unpack by reshape (else 8 loads)


GEMV_DISPATCH_M = 1  # rows w4a16_gemm sends to it: at M = 2..4 the 16-row tl.dot with
                     # split-K was as fast or faster on the H200 (bench/results/quant.md)
DEQUANT_MIN_M = 128  # from here on: dequantize to a dense weight, then a cuBLAS GEMM
MMA_DISPATCH_M = 32  # interleaved words: rows the MMA-fragment kernel takes (H200 sweep,
                     # bench/results/quant.md: at 64 rows it lost to tl.dot on one shape)


def _pow2_split(blocks: int, target: int, cap: int) -> int:
    """The smallest power of two s <= cap with blocks * s >= target."""
    split = 1
    while blocks * split < target and split < cap:
        split *= 2
    return split


def pick_config(m: int, n: int, k: int, group_size: int, num_sms: int = 132) -> GemmConfig:
    """tl.dot tiles by M bucket, from the H200 sweeps in bench/results/quant.md. Small M
    has few column tiles, so K is split until there are enough programs: M <= 16 a
    16x64 tile split up to 4 ways, 3 stages (16x128 split up to 8 on wide layers) aiming
    at 4 programs per SM; M <= 64 a 64x64x128 tile split up to 4 ways aiming at 2 (or,
    when N alone gives that many, a 64x128x128 4-warp tile: 8 warps ran 112 vs 87 us at
    4096x28672 in session 6); larger M 128x128 with 8 warps."""
    block_k = 128 if group_size % 128 == 0 else (64 if group_size % 64 == 0 else 32)
    n64 = -(-n // 64)
    if m <= 16:
        if n64 >= 2 * num_sms:   # wide layers: 128-column tiles
            return GemmConfig(16, 128, block_k, _pow2_split(-(-n // 128), 4 * num_sms, 8), 4, 3,
                              True)
        return GemmConfig(16, 64, block_k, _pow2_split(n64, 4 * num_sms, 4), 4, 3, True)
    if m <= 64:
        if n64 >= 2 * num_sms:
            return GemmConfig(64, 128, block_k, 1, 4, 3, True)
        return GemmConfig(64, 64, block_k, _pow2_split(n64, 2 * num_sms, 4), 4, 3, True)
    blocks = -(-m // 128) * -(-n // 128)
    return GemmConfig(128, 128, min(block_k, 64), 2 if 2 * blocks <= num_sms else 1, 8, 3,
                      True)


if triton is not None:

    @triton.jit
    def code_shift(j, BITS: tl.constexpr, INTERLEAVED: tl.constexpr):
        """``code_shifts`` for code indices j (a tensor)."""
        if INTERLEAVED:
            return 4 * ((j >> 1) + 4 * (j & 1))
        return j * BITS

    @triton.jit
    def _dot_tile(x, qw_ptr, s_ptr, z_ptr, k0, offs_n, mask_n, K,
                  stride_qk, stride_qn, stride_sg, stride_sn,
                  GROUP_SIZE: tl.constexpr, BITS: tl.constexpr, BLOCK_K: tl.constexpr,
                  GROUPS_ALIGNED: tl.constexpr, UNPACK_ONCE: tl.constexpr,
                  INTERLEAVED: tl.constexpr):
        """x [BLOCK_M, BLOCK_K] @ the dequantized [BLOCK_K, BLOCK_N] tile of rows k0.., fp32."""
        PACK: tl.constexpr = 32 // BITS
        MASK: tl.constexpr = (1 << BITS) - 1
        BLOCK_N: tl.constexpr = offs_n.shape[0]
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask_k = offs_k < K
        if UNPACK_ONCE:
            rows = k0 // PACK + tl.arange(0, BLOCK_K // PACK)
            words = tl.load(qw_ptr + rows[:, None] * stride_qk + offs_n[None, :] * stride_qn,
                            mask=(rows[:, None] * PACK < K) & mask_n[None, :], other=0)
            shifts = code_shift(tl.arange(0, PACK), BITS, INTERLEAVED)
            q3 = (words[:, None, :] >> shifts[None, :, None]) & MASK
            q = tl.reshape(q3, (BLOCK_K, BLOCK_N))
        else:
            words = tl.load(qw_ptr + (offs_k[:, None] // PACK) * stride_qk
                            + offs_n[None, :] * stride_qn,
                            mask=mask_k[:, None] & mask_n[None, :], other=0)
            q = (words >> code_shift(offs_k[:, None] % PACK, BITS, INTERLEAVED)) & MASK
        if GROUPS_ALIGNED:
            # One group per tile: the scale goes on the dot's result, not every element.
            g = k0 // GROUP_SIZE
            s = tl.load(s_ptr + g * stride_sg + offs_n * stride_sn, mask=mask_n, other=0.0)
            z = tl.load(z_ptr + g * stride_sg + offs_n * stride_sn, mask=mask_n, other=0.0)
            w = (q.to(tl.float32) - z.to(tl.float32)[None, :]).to(x.dtype)
            return tl.dot(x, w) * s.to(tl.float32)[None, :]
        else:
            g = offs_k // GROUP_SIZE
            gmask = mask_k[:, None] & mask_n[None, :]
            s = tl.load(s_ptr + g[:, None] * stride_sg + offs_n[None, :] * stride_sn,
                        mask=gmask, other=0.0)
            z = tl.load(z_ptr + g[:, None] * stride_sg + offs_n[None, :] * stride_sn,
                        mask=gmask, other=0.0)
            w = ((q.to(tl.float32) - z.to(tl.float32)) * s.to(tl.float32)).to(x.dtype)
            return tl.dot(x, w)

    @triton.jit
    def _wna16_gemm_kernel(
        x_ptr, qw_ptr, s_ptr, z_ptr, out_ptr, part_ptr, count_ptr,
        M, N, K,
        stride_xm, stride_xk, stride_qk, stride_qn, stride_sg, stride_sn,
        stride_om, stride_on,
        GROUP_SIZE: tl.constexpr, BITS: tl.constexpr, GROUPS_ALIGNED: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
        SPLIT_K, HAS_SPLIT: tl.constexpr, UNPACK_ONCE: tl.constexpr,
        LOOP_STAGES: tl.constexpr, INTERLEAVED: tl.constexpr,
    ):
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        pid_k = tl.program_id(2)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        mask_m = offs_m < M
        mask_n = offs_n < N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in tl.range(pid_k * BLOCK_K, K, BLOCK_K * SPLIT_K, num_stages=LOOP_STAGES):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            mask_k = offs_k < K
            x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk,
                        mask=mask_m[:, None] & mask_k[None, :], other=0.0)
            acc += _dot_tile(x, qw_ptr, s_ptr, z_ptr, k0, offs_n, mask_n, K,
                             stride_qk, stride_qn, stride_sg, stride_sn,
                             GROUP_SIZE, BITS, BLOCK_K, GROUPS_ALIGNED, UNPACK_ONCE,
                             INTERLEAVED)
        out_ptrs = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :] * stride_on
        out_mask = mask_m[:, None] & mask_n[None, :]
        if not HAS_SPLIT:
            tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=out_mask)
        else:
            # partials [SPLIT_K, M, N] fp32; the last split of this tile reduces them.
            part_ptrs = part_ptr + offs_m[:, None] * N + offs_n[None, :]
            tl.store(part_ptrs + pid_k * M * N, acc, mask=out_mask)
            tl.debug_barrier()
            tile = pid_m * tl.num_programs(1) + pid_n
            done = tl.atomic_add(count_ptr + tile, 1)
            if done == SPLIT_K - 1:
                total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
                for sk in range(SPLIT_K):
                    total += tl.load(part_ptrs + sk * M * N, mask=out_mask, other=0.0,
                                     cache_modifier=".cg")
                tl.store(out_ptrs, total.to(out_ptr.dtype.element_ty), mask=out_mask)
                tl.store(count_ptr + tile, 0)


def w4a16_gemm_triton(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                      zeros: torch.Tensor, group_size: int, bits: int = 4,
                      config: GemmConfig | None = None,
                      interleaved: bool = False) -> torch.Tensor:
    """Triton tl.dot path of ``w4a16_gemm_ref`` (same contract); x must be 2-D."""
    if triton is None:
        raise RuntimeError("w4a16_gemm_triton needs triton installed")
    m, k = x.shape
    n = qweight.shape[1]
    if config is None:
        config = pick_config(m, n, k, group_size, sm_count(x))
    aligned = group_size % config.block_k == 0
    splits = max(1, min(config.split_k, triton.cdiv(k, config.block_k)))
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(m, config.block_m), triton.cdiv(n, config.block_n), splits)
    partials, counters = split_buffers(out, splits, (m, n), grid[0] * grid[1])
    _wna16_gemm_kernel[grid](
        x, qweight, scales, zeros, out, partials, counters, m, n, k,
        x.stride(0), x.stride(1), qweight.stride(0), qweight.stride(1),
        scales.stride(0), scales.stride(1), out.stride(0), out.stride(1),
        GROUP_SIZE=group_size, BITS=bits, GROUPS_ALIGNED=aligned,
        BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
        SPLIT_K=splits, HAS_SPLIT=splits > 1, UNPACK_ONCE=config.unpack_once,
        LOOP_STAGES=config.num_stages, INTERLEAVED=interleaved,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )
    return out


def w4a16_gemm_dequant(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                       zeros: torch.Tensor, group_size: int, bits: int = 4,
                       interleaved: bool = False) -> torch.Tensor:
    """Large-M path (same contract as ``w4a16_gemm_ref``, x 2-D on CUDA): the dense
    weight in x's dtype, then a cuBLAS GEMM. Needs K x N x 2 bytes of scratch."""
    from tamis.kernels.wna16_dequant import dequantize_wna16_triton
    weight = dequantize_wna16_triton(qweight, scales, zeros, group_size, bits, x.shape[1],
                                     x.dtype, interleaved)
    return torch.matmul(x, weight)


def _tma_takes(x: torch.Tensor, n: int, group_size: int) -> bool:
    """A call on interleaved words that the TMA wgmma kernel takes (bf16 x on a Hopper
    GPU, rows and columns where ``tma_dispatch`` says, a weight shape it supports)."""
    from tamis.kernels.w4a16_wgmma import wgmma_device_supported
    from tamis.kernels.w4a16_wgmma_tma import tma_dispatch, tma_supported
    return (x.dtype == torch.bfloat16 and tma_dispatch(x.shape[0], n)
            and tma_supported(x.shape[0], n, x.shape[1], group_size)
            and wgmma_device_supported(x.device))


def _wgmma_takes(x: torch.Tensor, n: int, group_size: int) -> bool:
    """A call on interleaved words that the wgmma kernel takes (bf16 x on a Hopper GPU,
    a weight shape it supports, rows and columns where it is dispatched)."""
    from tamis.kernels.w4a16_mma import _weight_supported
    from tamis.kernels.w4a16_wgmma import wgmma_device_supported, wgmma_dispatch
    return (x.dtype == torch.bfloat16 and wgmma_dispatch(x.shape[0], n, x.shape[1])
            and _weight_supported(x.shape[1], group_size, 4)
            and wgmma_device_supported(x.device))


def w4a16_gemm(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
               zeros: torch.Tensor, group_size: int, bits: int = 4,
               interleaved: bool = False) -> torch.Tensor:
    """x [..., K] -> [..., N]. On CUDA, canonical words: a GEMV for M <= GEMV_DISPATCH_M,
    the tl.dot kernel up to DEQUANT_MIN_M, dequantize + cuBLAS above. Interleaved words
    (``tamis.kernels.w4a16_mma``, bf16 x): on a Hopper GPU the TMA wgmma kernel for 17..256
    rows (9..256 on layers narrower than 8192 columns) where it takes the shape
    (``tamis.kernels.w4a16_wgmma_tma``'s ``tma_dispatch`` and ``tma_supported``), else
    the cp.async wgmma kernel where ``tamis.kernels.w4a16_wgmma.wgmma_dispatch`` says
    (17..32 rows; to 64 on wide or deep layers), else the MMA-fragment kernel up to
    MMA_DISPATCH_M rows, then tl.dot / dequantize as above. The reference elsewhere."""
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    m, k = x2.shape
    if not (x2.is_cuda and triton is not None):
        out = w4a16_gemm_ref(x2, qweight, scales, zeros, group_size, bits, interleaved)
    elif interleaved and _tma_takes(x2, qweight.shape[1], group_size):
        from tamis.kernels.w4a16_wgmma_tma import w4a16_gemm_wgmma_tma
        out = w4a16_gemm_wgmma_tma(x2, qweight, scales, zeros, group_size)
    elif interleaved and _wgmma_takes(x2, qweight.shape[1], group_size):
        from tamis.kernels.w4a16_wgmma import w4a16_gemm_wgmma
        out = w4a16_gemm_wgmma(x2, qweight, scales, zeros, group_size)
    elif interleaved and m <= MMA_DISPATCH_M:
        from tamis.kernels.w4a16_mma import w4a16_gemm_mma
        out = w4a16_gemm_mma(x2, qweight, scales, zeros, group_size)
    elif not interleaved and m == 1 and packed_gemv_supported(x2, k, group_size, bits):
        out = w4a16_gemv_packed(x2, qweight, scales, zeros, group_size, bits)
    elif not interleaved and m <= GEMV_DISPATCH_M and gemv_supported(m, k, group_size, bits):
        out = w4a16_gemv_triton(x2, qweight, scales, zeros, group_size, bits)
    elif m >= DEQUANT_MIN_M:
        out = w4a16_gemm_dequant(x2, qweight, scales, zeros, group_size, bits,
                                 interleaved=interleaved)
    else:
        out = w4a16_gemm_triton(x2, qweight, scales, zeros, group_size, bits,
                                interleaved=interleaved)
    return out.reshape(*lead, out.shape[-1])
