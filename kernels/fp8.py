"""FP8 (e4m3) activation quantization and scaled matmul.

```
weight        float8_e4m3fn [N, K]
weight_scale  float32 [N] (per output channel; a per-tensor scale is expanded to N)
input_scale   float32 scalar for static activations, None for dynamic per-token
y = (x_q * x_scale) @ (weight * weight_scale).T + bias
```

- ``per_token_quant_fp8`` (Triton on CUDA; ``per_token_quant_fp8_ref`` otherwise): one
  scale per row, ``amax(row) / 448``.
- ``fp8_gemv_triton``: W8A16 for M <= ``GEMV_MAX_M`` (decode). Each program streams a
  [BLOCK_N, BLOCK_K] tile of e4m3 weights (16-byte loads along K), converts it in
  registers and accumulates ``w * x`` in fp32; the per-channel scale is applied once at
  the end. No activation quantization, so the weight bytes are all it reads. K is split
  over programs and reduced in the same launch (``tamis.kernels.splitk``).
- ``fp8_linear`` dispatches: on CUDA, M <= ``GEMV_DISPATCH_M`` runs that GEMV (any CUDA GPU);
  larger M on a GPU with FP8 (compute capability >= 8.9) runs W8A8 through
  ``torch._scaled_mm``; anything else runs W8A16 (the weight upcast to x's dtype), which
  is also the CPU reference. ``fp8_linear_ref`` emulates W8A8 exactly in fp32.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tamis.kernels.splitk import even_split, sm_count, split_counters

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)  # 448
_MIN_SCALE = 1.0 / (FP8_MAX * 512.0)  # keeps all-zero rows finite


def fp8_supported(device: torch.device | str) -> bool:
    """True on CUDA devices whose tensor cores take FP8 (Ada, Hopper and later)."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    return torch.cuda.get_device_capability(device) >= (8, 9)


def quantize_fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x / scale saturated to the e4m3 range (scale broadcasts against x)."""
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def per_token_quant_fp8_ref(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (float8 [M, K], float32 scales [M, 1])."""
    scale = (x.float().abs().amax(dim=-1, keepdim=True) / FP8_MAX).clamp(min=_MIN_SCALE)
    return quantize_fp8(x, scale), scale


if triton is not None:

    @triton.jit
    def _per_token_quant_kernel(x_ptr, q_ptr, s_ptr, K, stride_x, stride_q,
                                FP8_MAX_C: tl.constexpr, MIN_SCALE: tl.constexpr,
                                BLOCK: tl.constexpr):
        row = tl.program_id(0)
        amax = tl.zeros((BLOCK,), dtype=tl.float32)
        for k0 in range(0, K, BLOCK):
            offs = k0 + tl.arange(0, BLOCK)
            x = tl.load(x_ptr + row * stride_x + offs, mask=offs < K, other=0.0)
            amax = tl.maximum(amax, tl.abs(x.to(tl.float32)))
        scale = tl.maximum(tl.max(amax, axis=0) / FP8_MAX_C, MIN_SCALE)
        tl.store(s_ptr + row, scale)
        for k0 in range(0, K, BLOCK):
            offs = k0 + tl.arange(0, BLOCK)
            x = tl.load(x_ptr + row * stride_x + offs, mask=offs < K, other=0.0)
            q = tl.clamp(x.to(tl.float32) / scale, -FP8_MAX_C, FP8_MAX_C)
            tl.store(q_ptr + row * stride_q + offs, q.to(q_ptr.dtype.element_ty), mask=offs < K)


def per_token_quant_fp8_triton(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton path of ``per_token_quant_fp8_ref`` (same contract); x must be 2-D."""
    m, k = x.shape
    q = torch.empty((m, k), dtype=FP8_DTYPE, device=x.device)
    scale = torch.empty((m, 1), dtype=torch.float32, device=x.device)
    block = min(triton.next_power_of_2(k), 4096)
    _per_token_quant_kernel[(m,)](x, q, scale, k, x.stride(0), q.stride(0),
                                  FP8_MAX_C=FP8_MAX, MIN_SCALE=_MIN_SCALE, BLOCK=block,
                                  num_warps=4 if block <= 2048 else 8)
    return q, scale


def per_token_quant_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if x.is_cuda and triton is not None:
        return per_token_quant_fp8_triton(x)
    return per_token_quant_fp8_ref(x)


def fp8_linear_ref(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                   input_scale: torch.Tensor | None = None,
                   bias: torch.Tensor | None = None) -> torch.Tensor:
    """W8A8 emulated in fp32: the activation is quantized exactly as the GPU path does."""
    x2 = x.reshape(-1, x.shape[-1])
    if input_scale is None:
        xq, x_scale = per_token_quant_fp8_ref(x2)
    else:
        x_scale = input_scale.float().reshape(1, 1)
        xq = quantize_fp8(x2, x_scale)
    w = weight.float() * weight_scale.float().reshape(-1, 1)
    out = (xq.float() * x_scale) @ w.t()
    if bias is not None:
        out = out + bias.float()
    return out.to(x.dtype).reshape(*x.shape[:-1], -1)


def fp8_linear_w8a16(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                     bias: torch.Tensor | None = None) -> torch.Tensor:
    """The weight upcast to x's dtype (GPUs without FP8, CPUs)."""
    w = (weight.to(torch.float32) * weight_scale.float().reshape(-1, 1)).to(x.dtype)
    return F.linear(x, w, bias)


def fp8_scaled_mm(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                  input_scale: torch.Tensor | None = None,
                  bias: torch.Tensor | None = None) -> torch.Tensor:
    """W8A8 on an FP8 GPU: per-token (dynamic) or per-tensor (static) activation scales,
    per-channel weight scales, through ``torch._scaled_mm``. x: [M, K] bf16/fp16."""
    if input_scale is None:
        xq, x_scale = per_token_quant_fp8(x)
    else:
        x_scale = input_scale.float().reshape(1, 1)
        xq = quantize_fp8(x, x_scale)
        x_scale = x_scale.expand(x.shape[0], 1).contiguous()
    # Row-wise scaling (scale_a [M, 1], scale_b [1, N]) takes bf16 output only.
    out = torch._scaled_mm(xq, weight.t(), scale_a=x_scale,
                           scale_b=weight_scale.float().reshape(1, -1),
                           out_dtype=torch.bfloat16)
    if bias is not None:
        out = out + bias.to(out.dtype)
    return out.to(x.dtype)


@dataclass(frozen=True)
class Fp8GemvConfig:
    block_n: int   # weight rows (output columns) per program
    block_k: int   # K elements per loop step
    split_k: int   # programs along K per row block (reduced in the same launch)
    num_warps: int = 4
    num_stages: int = 3
    # Software-pipeline the loop's loads through shared memory, this many tiles deep
    # (1 = plain loads; Triton pipelines loads that feed no tl.dot only in a tl.range
    # loop given num_stages).
    loop_stages: int = 1
    prefetch: bool = False  # load the next weight tile before using this one


GEMV_MAX_M = 4      # rows the GEMV kernel takes
GEMV_DISPATCH_M = 2  # rows fp8_linear sends to it (at M = 4 _scaled_mm was faster on the H200)


def pick_fp8_gemv_config(m: int, n: int, k: int, num_sms: int = 132) -> Fp8GemvConfig:
    """From the H200 sweep (bench/results/quant.md): 16 rows per program; 512 K per step
    unless N alone gives 8 programs per SM (then 256, fewer live registers); K split
    until there are 2 programs per SM; one row pipelines its loads 3 tiles deep (session
    6 sweep: 14336x4096 19.8 -> 17.4 us). Several rows take 256 K per step."""
    block_n = 16
    blocks = -(-n // block_n)
    block_k = 512 if m == 1 and blocks < 8 * num_sms else 256
    split_k = 1
    while blocks * split_k < 2 * num_sms and split_k < 16:
        split_k *= 2
    return Fp8GemvConfig(block_n, block_k, split_k, loop_stages=3 if m == 1 else 1)


if triton is not None:

    @triton.jit
    def _fp8_gemv_kernel(x_ptr, w_ptr, ws_ptr, out_ptr, part_ptr, count_ptr,
                         M, N, K, K_SPLIT, stride_xm, stride_wn, stride_om,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         SPLIT, HAS_SPLIT: tl.constexpr, PREFETCH: tl.constexpr,
                         LOOP_STAGES: tl.constexpr):
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
        scale = tl.load(ws_ptr + offs_n, mask=mask_n, other=0.0)
        for m in tl.static_range(BLOCK_M):
            if m == 0:
                col = tl.sum(acc0, axis=1)
            elif m == 1:
                col = tl.sum(acc1, axis=1)
            elif m == 2:
                col = tl.sum(acc2, axis=1)
            else:
                col = tl.sum(acc3, axis=1)
            if not HAS_SPLIT:
                tl.store(out_ptr + m * stride_om + offs_n,
                         (col * scale).to(out_ptr.dtype.element_ty), mask=mask_n & (m_n > m))
            else:
                tl.store(part_ptr + (pid_k * BLOCK_M + m) * N + offs_n, col, mask=mask_n)
        if HAS_SPLIT:
            # Every thread's partials are stored before the (releasing) count.
            tl.debug_barrier()
            done = tl.atomic_add(count_ptr + pid_n, 1)
            if done == SPLIT - 1:
                for m in tl.static_range(BLOCK_M):
                    total = tl.zeros((BLOCK_N,), dtype=tl.float32)
                    for sk in range(SPLIT):
                        total += tl.load(part_ptr + (sk * BLOCK_M + m) * N + offs_n,
                                         mask=mask_n, other=0.0, cache_modifier=".cg")
                    tl.store(out_ptr + m * stride_om + offs_n,
                             (total * scale).to(out_ptr.dtype.element_ty),
                             mask=mask_n & (m_n > m))
                tl.store(count_ptr + pid_n, 0)


def fp8_gemv_triton(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                    config: Fp8GemvConfig | None = None) -> torch.Tensor:
    """W8A16 ``x @ (weight * weight_scale).T`` for x [M, K], M <= GEMV_MAX_M, weight
    float8 [N, K] contiguous, weight_scale float32 [N]; out in x's dtype."""
    if triton is None:
        raise RuntimeError("fp8_gemv_triton needs triton installed")
    m, k = x.shape
    n = weight.shape[0]
    if m > GEMV_MAX_M:
        raise ValueError(f"fp8_gemv_triton takes M <= {GEMV_MAX_M}, got {m}")
    if x.stride(1) != 1:
        x = x.contiguous()
    if weight.stride(1) != 1:
        weight = weight.contiguous()
    scale = weight_scale.float().reshape(-1)
    if scale.numel() == 1:
        scale = scale.expand(n).contiguous()
    config = config or pick_fp8_gemv_config(m, n, k, sm_count(x))
    splits, k_split = even_split(k, config.block_k, config.split_k)
    blocks = triton.cdiv(n, config.block_n)
    block_m = 1 if m == 1 else (2 if m == 2 else 4)
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if splits > 1:
        partials = torch.empty((splits, block_m, n), dtype=torch.float32, device=x.device)
        counters = split_counters(x.device, blocks)
    else:
        partials = counters = out  # unused
    _fp8_gemv_kernel[(blocks, splits)](
        x, weight, scale, out, partials, counters, m, n, k, k_split,
        x.stride(0), weight.stride(0), out.stride(0),
        BLOCK_M=block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
        SPLIT=splits, HAS_SPLIT=splits > 1, PREFETCH=config.prefetch,
        LOOP_STAGES=config.loop_stages,
        num_warps=config.num_warps, num_stages=config.num_stages)
    return out


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
               input_scale: torch.Tensor | None = None,
               bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] -> [..., N]: on CUDA the W8A16 GEMV for M <= GEMV_DISPATCH_M (the static
    input scale is then unused: activations stay in x's dtype); W8A8 on an FP8 GPU
    (K, N multiples of 16) above that; else W8A16 through a dequantized weight."""
    n, k = weight.shape
    m = x.numel() // k if k else 0
    if x.is_cuda and triton is not None and 0 < m <= GEMV_DISPATCH_M:
        out = fp8_gemv_triton(x.reshape(m, k), weight, weight_scale)
        if bias is not None:
            out = out + bias.to(out.dtype)
        return out.reshape(*x.shape[:-1], n)
    if fp8_supported(x.device) and k % 16 == 0 and n % 16 == 0:
        x2 = x.reshape(-1, k)
        return fp8_scaled_mm(x2, weight, weight_scale, input_scale, bias).reshape(
            *x.shape[:-1], n)
    return fp8_linear_w8a16(x, weight, weight_scale, bias)
