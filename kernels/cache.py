"""Writes the K/V of new tokens into the paged cache.

``store_kv_cache(key, value, kv_cache, slot_mapping)``: key/value ``[T, Hkv, D]`` (any
token/head strides, last dim contiguous), kv_cache ``[2, num_blocks, block_size, Hkv, D]``
contiguous, slot_mapping int ``[T]``. Token t goes to ``kv_cache[:, slot // block_size,
slot % block_size]``; ``slot == -1`` (padding) is skipped. Layout as in
``engine/attention/metadata.py``.

An FP8 cache (``torch.float8_e4m3fn``) holds ``x * (1 / scale)`` (the reciprocal rounded
to float32 once, so every implementation stores the same bytes) clamped to e4m3's range, with
one scale per layer for keys (``k_scale``) and one for values (``v_scale``); readers
multiply back (``dequantize_kv``). Other cache dtypes ignore the scales (a plain cast).
"""
from __future__ import annotations

import torch

from tamis.kernels._triton import kernel, next_power_of_2, use_triton
from tamis.kernels.kv_quant import (FP8_E4M3_MAX, dequantize_kv,  # noqa: F401  (re-exported)
                                    is_fp8, quantize_kv)

try:
    import triton.language as tl
    from tamis.kernels.e4m3 import e4m3_code
except ImportError:
    tl = None


def _check(key, value, kv_cache, slot_mapping) -> None:
    if kv_cache.dim() != 5 or kv_cache.shape[0] != 2:
        raise ValueError(f"kv_cache must be [2, num_blocks, block_size, kv_heads, head_dim], "
                         f"got {tuple(kv_cache.shape)}")
    if key.shape != value.shape or key.dim() != 3 or key.shape[1:] != kv_cache.shape[3:]:
        raise ValueError(f"key/value must be [T, {kv_cache.shape[3]}, {kv_cache.shape[4]}], "
                         f"got {tuple(key.shape)} and {tuple(value.shape)}")
    if slot_mapping.shape != (key.shape[0],):
        raise ValueError(f"slot_mapping must be [T] = [{key.shape[0]}], "
                         f"got {tuple(slot_mapping.shape)}")
    if not kv_cache.is_contiguous():
        raise ValueError("kv_cache must be contiguous")


def store_kv_cache_ref(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                       slot_mapping: torch.Tensor, k_scale: float = 1.0,
                       v_scale: float = 1.0) -> None:
    _check(key, value, kv_cache, slot_mapping)
    heads, dim = kv_cache.shape[3:]
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    kv_cache[0].view(-1, heads, dim)[slots] = quantize_kv(key[keep], k_scale, kv_cache.dtype)
    kv_cache[1].view(-1, heads, dim)[slots] = quantize_kv(value[keep], v_scale, kv_cache.dtype)


if tl is not None:
    @kernel
    def _store_kv_kernel(key_ptr, value_ptr, cache_ptr, slot_ptr, num_heads, head_dim,
                         key_tok_stride, key_head_stride, value_tok_stride, value_head_stride,
                         values_offset, k_inv_scale, v_inv_scale, HEADS: tl.constexpr,
                         DIM: tl.constexpr, FP8: tl.constexpr):
        """FP8: ``cache_ptr`` is the cache's bytes (a uint8 view) and e4m3 is encoded with
        integer ops (``kernels/e4m3.py``), as torch's cast rounds."""
        tok = tl.program_id(0).to(tl.int64)
        slot = tl.load(slot_ptr + tok).to(tl.int64)
        if slot >= 0:
            h = tl.arange(0, HEADS)[:, None]
            d = tl.arange(0, DIM)[None, :]
            mask = (h < num_heads) & (d < head_dim)
            k = tl.load(key_ptr + tok * key_tok_stride + h * key_head_stride + d, mask=mask)
            v = tl.load(value_ptr + tok * value_tok_stride + h * value_head_stride + d,
                        mask=mask)
            if FP8:
                x = tl.join(k.to(tl.float32) * k_inv_scale, v.to(tl.float32) * v_inv_scale)
                k, v = tl.split(e4m3_code(tl.minimum(tl.maximum(x, -448.0), 448.0)))
            dst = cache_ptr + slot * num_heads * head_dim + h * head_dim + d
            tl.store(dst, k.to(cache_ptr.dtype.element_ty), mask=mask)
            tl.store(dst + values_offset, v.to(cache_ptr.dtype.element_ty), mask=mask)


def store_kv_cache_triton(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                          slot_mapping: torch.Tensor, k_scale: float = 1.0,
                          v_scale: float = 1.0) -> None:
    _check(key, value, kv_cache, slot_mapping)
    if key.stride(-1) != 1 or value.stride(-1) != 1:
        raise ValueError("key/value need a contiguous last dim")
    if key.shape[0] == 0:
        return
    heads, dim = kv_cache.shape[3:]
    fp8 = is_fp8(kv_cache.dtype)
    _store_kv_kernel[(key.shape[0],)](
        key, value, kv_cache.view(torch.uint8) if fp8 else kv_cache, slot_mapping, heads, dim,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1), kv_cache[0].numel(),
        1.0 / k_scale, 1.0 / v_scale, HEADS=next_power_of_2(heads), DIM=next_power_of_2(dim),
        FP8=fp8, num_warps=4)


def store_kv_cache(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                   slot_mapping: torch.Tensor, k_scale: float = 1.0,
                   v_scale: float = 1.0) -> None:
    """Stores key/value at their slots (Triton on CUDA, reference elsewhere)."""
    store = store_kv_cache_triton if use_triton(kv_cache) else store_kv_cache_ref
    store(key, value, kv_cache, slot_mapping, k_scale, v_scale)
