"""How a KV cache stores K/V: a plain cast, or for FP8 (``torch.float8_e4m3fn``) ``x * (1 /
scale)`` clamped to e4m3's range, one scale per layer for keys and one for values.

Plain torch, no Triton: the torch attention backend imports it, and importing the engine
must leave Triton unimported (the kernels choose its mode on first use).
"""
from __future__ import annotations

import torch

FP8_E4M3_MAX = 448.0   # the largest finite float8_e4m3fn


def is_fp8(dtype: torch.dtype) -> bool:
    return dtype == torch.float8_e4m3fn


def quantize_kv(x: torch.Tensor, scale: float, cache_dtype: torch.dtype) -> torch.Tensor:
    """x as stored in a cache of ``cache_dtype``: ``x / scale`` clamped to e4m3 for FP8."""
    if not is_fp8(cache_dtype):
        return x.to(cache_dtype)
    return (x.float() * (1.0 / scale)).clamp_(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(cache_dtype)


def dequantize_kv(x: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """Cache contents back in ``dtype``: ``x * scale`` (in float32) for FP8, else a cast."""
    if not is_fp8(x.dtype):
        return x.to(dtype)
    return (x.float() * scale).to(dtype)
