"""Paged attention for decode: one query token per sequence, split-K over long contexts.

::

    q [B, Hq, D] (the token at position seq_len - 1 of each sequence), kv_cache
    [2, num_blocks, block_size, Hkv, D], seq_lens int32 [B], block_tables int32 [B, M]

    stage 1, grid (B, Hkv, S): program (b, g, s) takes the s-th of S equal slices of
        sequence b's keys (rounded to BLOCK_N) and all Hq/Hkv query heads of KV head g,
        so each K/V tile is read once for the whole group; writes a partial output and
        its log-sum-exp.
    stage 2, grid (B, Hq): merges the S partials.

S depends only on (B, Hkv, the device), never on the lengths, so a captured CUDA graph
stays valid for any lengths; slices past a sequence's end do no work. A sequence with
seq_len 0 (a padding row of a captured batch) gets zeros. Sliding window W: keys
``j >= seq_len - W``. Soft cap C: scores ``C * tanh(s / C)`` (as in attention_prefill).
An FP8 cache is read as ``x * k_scale`` / ``x * v_scale`` (see kernels/kv_quant.py).
"""
from __future__ import annotations

import functools
import math

import torch

from tamis.kernels import pdl
from tamis.kernels._triton import kernel, next_power_of_2, use_triton
from tamis.kernels.attention_prefill import attend_ref, gather_kv, check_paged_inputs
from tamis.kernels.kv_quant import is_fp8

try:
    import triton
    import triton.language as tl
    from tamis.kernels.pdl import gdc_launch_dependents
except ImportError:
    triton = tl = None


def paged_attention_decode_ref(q: torch.Tensor, kv_cache: torch.Tensor,
                               seq_lens: torch.Tensor, block_tables: torch.Tensor,
                               scale: float, sliding_window: int | None = None,
                               soft_cap: float | None = None, k_scale: float = 1.0,
                               v_scale: float = 1.0) -> torch.Tensor:
    check_paged_inputs(q, kv_cache, seq_lens, block_tables)
    num_seqs = seq_lens.shape[0]
    if q.shape[0] != num_seqs:
        raise ValueError(f"decode takes one query per sequence: q has {q.shape[0]} tokens, "
                         f"seq_lens {num_seqs}")
    out = torch.zeros_like(q)
    for b, seq_len in enumerate(seq_lens.tolist()):
        if seq_len > 0:   # seq_len 0: a padding row, left at zero
            k, v = gather_kv(kv_cache, block_tables[b], seq_len, k_scale, v_scale)
            out[b:b + 1] = attend_ref(q[b:b + 1], k, v, seq_len - 1, scale,
                                       sliding_window, soft_cap).to(q.dtype)
    return out


@functools.cache
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def default_num_splits(num_seqs: int, num_kv_heads: int, device: torch.device) -> int:
    """Enough programs for about two waves of the device, at most 32 splits (on the
    H200, 64 x 2,048 tokens: 1 split 0.142 ms, 2 splits 0.150 ms; bench_kernels.py)."""
    sms = _num_sms(device.index or 0) if device.type == "cuda" else 4
    want = 2 * sms
    return max(1, min(32, -(-want // max(1, num_seqs * num_kv_heads))))


if tl is not None:
    @kernel
    def _decode_split_kernel(q_ptr, cache_ptr, mid_o_ptr, mid_lse_ptr, seq_lens_ptr, bt_ptr,
                             scale_log2, window, cap_log2, q_tok_stride, q_head_stride, bt_stride,
                             values_offset, num_kv_heads, group, block_size, head_dim,
                             num_splits, k_scale, v_scale,
                             HEAD_DIM: tl.constexpr, GROUP: tl.constexpr,
                             BLOCK_N: tl.constexpr, SLIDING: tl.constexpr,
                             SOFTCAP: tl.constexpr, PRECISION: tl.constexpr,
                             FP8: tl.constexpr):
        seq = tl.program_id(0)
        kv_head = tl.program_id(1)
        split = tl.program_id(2)
        seq_len = tl.load(seq_lens_ptr + seq)
        per_split = tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
        lo = split * per_split
        hi = tl.minimum(seq_len, lo + per_split)
        if SLIDING:
            lo = tl.maximum(lo, seq_len - window)

        offs_g = tl.arange(0, GROUP)
        g_mask = offs_g < group
        heads = kv_head * group + offs_g
        offs_d = tl.arange(0, HEAD_DIM)
        d_mask = offs_d < head_dim
        q = tl.load(q_ptr + seq.to(tl.int64) * q_tok_stride + heads[:, None] * q_head_stride
                    + offs_d[None, :], mask=g_mask[:, None] & d_mask[None, :], other=0.0)

        m_i = tl.full([GROUP], float("-inf"), tl.float32)
        l_i = tl.zeros([GROUP], tl.float32)
        acc = tl.zeros([GROUP, HEAD_DIM], tl.float32)
        row_stride = num_kv_heads * head_dim
        for start_n in range(lo, hi, BLOCK_N):
            offs_n = start_n + tl.arange(0, BLOCK_N)
            n_mask = offs_n < hi
            block = tl.load(bt_ptr + seq * bt_stride + offs_n // block_size,
                            mask=n_mask, other=0).to(tl.int64)
            slot = block * block_size + offs_n % block_size
            kv_off = slot[:, None] * row_stride + kv_head * head_dim + offs_d[None, :]
            kv_mask = n_mask[:, None] & d_mask[None, :]
            k = tl.load(cache_ptr + kv_off, mask=kv_mask, other=0.0)
            v = tl.load(cache_ptr + values_offset + kv_off, mask=kv_mask, other=0.0)
            if FP8:
                k = k.to(tl.float32) * k_scale
                v = v.to(tl.float32) * v_scale
            k = k.to(q.dtype)
            v = v.to(q.dtype)
            s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale_log2
            if SOFTCAP:   # C*tanh(x/C) on the log2(e)-scaled scores: cap_log2 = C*log2(e)
                s = cap_log2 * (1.0 - 2.0 / (tl.exp(2.0 * s / cap_log2) + 1.0))
            s = tl.where(n_mask[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp2(s - m_safe[:, None])
            alpha = tl.exp2(m_i - m_safe)
            l_i = l_i * alpha + tl.sum(p, axis=1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
            m_i = m_new

        # Partials are [B, Hq, S, D] / [B, Hq, S]; an empty slice has lse = -inf.
        empty = l_i == 0.0
        out = acc / tl.where(empty, 1.0, l_i)[:, None]
        lse = tl.where(empty, float("-inf"), m_i + tl.log2(tl.where(empty, 1.0, l_i)))
        row = (seq * num_kv_heads * group + heads).to(tl.int64) * num_splits + split
        tl.store(mid_o_ptr + row[:, None] * head_dim + offs_d[None, :], out,
                 mask=g_mask[:, None] & d_mask[None, :])
        tl.store(mid_lse_ptr + row, lse, mask=g_mask)

    @kernel
    def _decode_merge_kernel(mid_o_ptr, mid_lse_ptr, out_ptr, o_tok_stride, o_head_stride,
                             num_heads, head_dim, num_splits,
                             HEAD_DIM: tl.constexpr, SPLITS: tl.constexpr,
                             PDL_TRIGGER: tl.constexpr):
        if PDL_TRIGGER:  # the next GEMM may start loading its weights (tamis.kernels.pdl)
            gdc_launch_dependents()
        seq = tl.program_id(0)
        head = tl.program_id(1)
        offs_s = tl.arange(0, SPLITS)
        offs_d = tl.arange(0, HEAD_DIM)
        row = (seq * num_heads + head).to(tl.int64) * num_splits
        lse = tl.load(mid_lse_ptr + row + offs_s, mask=offs_s < num_splits,
                      other=float("-inf"))
        m = tl.max(lse, axis=0)
        m_safe = tl.where(m == float("-inf"), 0.0, m)
        w = tl.exp2(lse - m_safe)
        total = tl.sum(w, axis=0)
        parts = tl.load(mid_o_ptr + (row + offs_s)[:, None] * head_dim + offs_d[None, :],
                        mask=(offs_s < num_splits)[:, None] & (offs_d < head_dim)[None, :],
                        other=0.0)
        out = tl.sum(parts * w[:, None], axis=0) / tl.where(total == 0.0, 1.0, total)
        tl.store(out_ptr + seq.to(tl.int64) * o_tok_stride + head * o_head_stride + offs_d,
                 out.to(out_ptr.dtype.element_ty), mask=offs_d < head_dim)


def paged_attention_decode_triton(q: torch.Tensor, kv_cache: torch.Tensor,
                                  seq_lens: torch.Tensor, block_tables: torch.Tensor,
                                  scale: float, sliding_window: int | None = None,
                                  num_splits: int | None = None, block_n: int | None = None,
                                  num_warps: int = 4, num_stages: int = 2,
                                  out: torch.Tensor | None = None,
                                  soft_cap: float | None = None, k_scale: float = 1.0,
                                  v_scale: float = 1.0) -> torch.Tensor:
    """``num_splits``, ``block_n``, ``num_warps``, ``num_stages``: launch overrides
    (benchmarks); ``out``: where to write (a view is fine)."""
    check_paged_inputs(q, kv_cache, seq_lens, block_tables)
    num_seqs, num_heads, head_dim = q.shape
    if num_seqs != seq_lens.shape[0]:
        raise ValueError(f"decode takes one query per sequence: q has {num_seqs} tokens, "
                         f"seq_lens {seq_lens.shape[0]}")
    out = torch.empty_like(q) if out is None else out
    if num_seqs == 0:
        return out
    _, _, block_size, num_kv_heads, _ = kv_cache.shape
    splits = num_splits or default_num_splits(num_seqs, num_kv_heads, q.device)
    block_n = block_n or (64 if q.is_cuda else 16)
    group = num_heads // num_kv_heads
    mid_o = torch.empty(num_seqs, num_heads, splits, head_dim, dtype=torch.float32,
                        device=q.device)
    mid_lse = torch.empty(num_seqs, num_heads, splits, dtype=torch.float32, device=q.device)
    head_block = next_power_of_2(max(16, head_dim))
    _decode_split_kernel[(num_seqs, num_kv_heads, splits)](
        q, kv_cache, mid_o, mid_lse, seq_lens, block_tables, scale * math.log2(math.e),
        sliding_window or 0, (soft_cap or 1.0) * math.log2(math.e), q.stride(0), q.stride(1),
        block_tables.stride(0),
        kv_cache[0].numel(), num_kv_heads, group, block_size, head_dim, splits,
        float(k_scale), float(v_scale),
        HEAD_DIM=head_block, GROUP=next_power_of_2(max(16, group)), BLOCK_N=block_n,
        SLIDING=sliding_window is not None, SOFTCAP=soft_cap is not None,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32", FP8=is_fp8(kv_cache.dtype),
        num_warps=num_warps, num_stages=num_stages)
    _decode_merge_kernel[(num_seqs, num_heads)](
        mid_o, mid_lse, out, out.stride(0), out.stride(1), num_heads, head_dim, splits,
        HEAD_DIM=head_block, SPLITS=max(2, next_power_of_2(splits)),
        PDL_TRIGGER=pdl.lets_next_launch(q.device, num_seqs), num_warps=4)
    return out


def paged_attention_decode(q: torch.Tensor, kv_cache: torch.Tensor, seq_lens: torch.Tensor,
                           block_tables: torch.Tensor, scale: float,
                           sliding_window: int | None = None,
                           num_splits: int | None = None,
                           soft_cap: float | None = None, k_scale: float = 1.0,
                           v_scale: float = 1.0) -> torch.Tensor:
    """Triton on CUDA, the reference elsewhere (see the module docstring)."""
    scales = dict(k_scale=k_scale, v_scale=v_scale)
    if use_triton(q):
        return paged_attention_decode_triton(q, kv_cache, seq_lens, block_tables, scale,
                                             sliding_window, num_splits, soft_cap=soft_cap,
                                             **scales)
    return paged_attention_decode_ref(q, kv_cache, seq_lens, block_tables, scale,
                                      sliding_window, soft_cap, **scales)
