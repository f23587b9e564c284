"""Dequantize the shared W4A16/W8A16 layout (see ``tamis.kernels.w4a16``) into a dense
[K, N] weight in the activation's dtype, on the GPU.

For large M (prefill) a dequantize-then-cuBLAS GEMM beats dequantizing inside a Triton
tl.dot main loop: the dense write costs ~2 bytes per weight once per call, while the
GEMM then runs at cuBLAS's rate (``w4a16_gemm_dequant``; a layer's kernel,
``tamis.quant.wna16_kernels``, runs it from ``DEQUANT_MIN_M`` rows on).

Each program unpacks a [BLOCK_KW, BLOCK_N] tile of words (loaded once, coalesced along N)
into 32 // bits rows of output per word row; ``(q - z) * s`` in fp32, rounded once.
"""
from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None


if triton is not None:
    from tamis.kernels.w4a16_common import code_shift

    @triton.jit
    def _wna16_dequant_kernel(qw_ptr, s_ptr, z_ptr, out_ptr, N, K,
                              stride_qk, stride_sg, stride_ok,
                              GROUP_SIZE: tl.constexpr, BITS: tl.constexpr,
                              ROW_GROUPS: tl.constexpr, INTERLEAVED: tl.constexpr,
                              BLOCK_KW: tl.constexpr, BLOCK_N: tl.constexpr):
        PACK: tl.constexpr = 32 // BITS
        MASK: tl.constexpr = (1 << BITS) - 1
        rows = tl.program_id(0) * BLOCK_KW + tl.arange(0, BLOCK_KW)
        offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        mask_n = offs_n < N
        wmask = (rows[:, None] * PACK < K) & mask_n[None, :]
        words = tl.load(qw_ptr + rows[:, None] * stride_qk + offs_n[None, :], mask=wmask,
                        other=0)
        if ROW_GROUPS:  # every group is whole words: one scale row per word row
            g = (rows * PACK) // GROUP_SIZE
            s = tl.load(s_ptr + g[:, None] * stride_sg + offs_n[None, :], mask=wmask,
                        other=0.0).to(tl.float32)
            z = tl.load(z_ptr + g[:, None] * stride_sg + offs_n[None, :], mask=wmask,
                        other=0.0).to(tl.float32)
        for j in tl.static_range(PACK):
            k = rows * PACK + j
            kmask = (k[:, None] < K) & mask_n[None, :]
            if not ROW_GROUPS:
                g = k // GROUP_SIZE
                s = tl.load(s_ptr + g[:, None] * stride_sg + offs_n[None, :], mask=kmask,
                            other=0.0).to(tl.float32)
                z = tl.load(z_ptr + g[:, None] * stride_sg + offs_n[None, :], mask=kmask,
                            other=0.0).to(tl.float32)
            q = ((words >> code_shift(j, BITS, INTERLEAVED)) & MASK).to(tl.float32)
            tl.store(out_ptr + k[:, None] * stride_ok + offs_n[None, :],
                     ((q - z) * s).to(out_ptr.dtype.element_ty), mask=kmask)


def dequantize_wna16_triton(qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                            group_size: int, bits: int, in_features: int,
                            dtype: torch.dtype, interleaved: bool = False) -> torch.Tensor:
    """``dequantize_wna16`` (same contract) rounded once to ``dtype``: [K, N]."""
    if triton is None:
        raise RuntimeError("dequantize_wna16_triton needs triton installed")
    k, n = in_features, qweight.shape[1]
    out = torch.empty((k, n), dtype=dtype, device=qweight.device)
    block_kw, block_n = 8, 256
    grid = (triton.cdiv(qweight.shape[0], block_kw), triton.cdiv(n, block_n))
    _wna16_dequant_kernel[grid](
        qweight, scales, zeros, out, n, k, qweight.stride(0), scales.stride(0), out.stride(0),
        GROUP_SIZE=group_size, BITS=bits,
        ROW_GROUPS=group_size % (32 // bits) == 0 or group_size >= k, INTERLEAVED=interleaved,
        BLOCK_KW=block_kw, BLOCK_N=block_n, num_warps=4)
    return out
