"""Paged attention over a varlen batch: each query chunk attends to its cached prefix and itself.

::

    q            [T, Hq, D]     tokens of all sequences, back to back (query_start_loc)
    kv_cache     [2, num_blocks, block_size, Hkv, D]   K/V of every token, new ones included
    query_start_loc int32 [B + 1];  seq_lens int32 [B] (cached + new);  block_tables int32 [B, M]

    sequence b:  keys 0 .. seq_len-1 ; its qlen queries sit at positions ctx .. seq_len-1
                 (ctx = seq_len - qlen); query at position p sees keys j <= p, and with a
                 sliding window W only keys with p - j < W.

GQA: query head h reads KV head ``h // (Hq // Hkv)``. The new tokens' K/V must already be
in the cache (``store_kv_cache`` first). A cache in another dtype than q is read as q's
dtype; an FP8 cache is read as ``x * k_scale`` / ``x * v_scale`` (see kernels/kv_quant.py). Output ``[T, Hq, D]`` in q's dtype; softmax in float32. A query with no visible key (impossible for valid metadata) gets zeros.
With ``soft_cap`` C each scaled score s becomes ``C * tanh(s / C)`` before the softmax
(Gemma 2's attention logit soft-capping).
"""
from __future__ import annotations

import math

import torch

from tamis.kernels._triton import kernel, next_power_of_2, use_triton
from tamis.kernels.kv_quant import dequantize_kv, is_fp8

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = tl = None


def check_paged_inputs(q: torch.Tensor, kv_cache: torch.Tensor, seq_lens: torch.Tensor,
                       block_tables: torch.Tensor) -> None:
    """Shape checks shared by prefill and decode; ValueError naming the bad argument."""
    if kv_cache.dim() != 5 or kv_cache.shape[0] != 2 or not kv_cache.is_contiguous():
        raise ValueError(f"kv_cache must be a contiguous [2, num_blocks, block_size, kv_heads, "
                         f"head_dim] tensor, got {tuple(kv_cache.shape)}")
    if q.dim() != 3 or q.shape[-1] != kv_cache.shape[-1] or q.stride(-1) != 1:
        raise ValueError(f"q must be [tokens, heads, {kv_cache.shape[-1]}] with a contiguous "
                         f"last dim, got {tuple(q.shape)}")
    if q.shape[1] % kv_cache.shape[3]:
        raise ValueError(f"query heads ({q.shape[1]}) must be a multiple of KV heads "
                         f"({kv_cache.shape[3]})")
    if block_tables.dim() != 2 or block_tables.shape[0] != seq_lens.shape[0]:
        raise ValueError(f"block_tables must be [num_seqs={seq_lens.shape[0]}, max_blocks], "
                         f"got {tuple(block_tables.shape)}")


def gather_kv(kv_cache, block_table_row, seq_len, k_scale=1.0, v_scale=1.0):
    """One sequence's keys and values [seq_len, Hkv, D] in float32 (FP8 dequantized)."""
    block_size = kv_cache.shape[2]
    blocks = block_table_row[:(seq_len + block_size - 1) // block_size].long()
    k = kv_cache[0, blocks].flatten(0, 1)[:seq_len]
    v = kv_cache[1, blocks].flatten(0, 1)[:seq_len]
    return dequantize_kv(k, k_scale, torch.float32), dequantize_kv(v, v_scale, torch.float32)


def attend_ref(q, k, v, context_len, scale, sliding_window, soft_cap=None):
    """q [n, Hq, D] at positions context_len.., k/v [L, Hkv, D] -> [n, Hq, D] (float32)."""
    group = q.shape[1] // k.shape[1]
    k = k.float().repeat_interleave(group, dim=1)
    v = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k) * scale
    if soft_cap is not None:
        scores = torch.tanh(scores / soft_cap) * soft_cap
    q_pos = context_len + torch.arange(q.shape[0], device=q.device)[:, None]
    k_pos = torch.arange(k.shape[0], device=q.device)[None, :]
    visible = k_pos <= q_pos
    if sliding_window is not None:
        visible &= (q_pos - k_pos) < sliding_window
    scores = scores.masked_fill(~visible, float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return torch.einsum("hqk,khd->qhd", probs, v)


def paged_attention_prefill_ref(q: torch.Tensor, kv_cache: torch.Tensor,
                                query_start_loc: torch.Tensor, seq_lens: torch.Tensor,
                                block_tables: torch.Tensor, scale: float,
                                sliding_window: int | None = None,
                                soft_cap: float | None = None, k_scale: float = 1.0,
                                v_scale: float = 1.0) -> torch.Tensor:
    check_paged_inputs(q, kv_cache, seq_lens, block_tables)
    out = torch.zeros_like(q)
    starts = query_start_loc.tolist()
    for b, seq_len in enumerate(seq_lens.tolist()):
        start, end = starts[b], starts[b + 1]
        if end == start:
            continue
        k, v = gather_kv(kv_cache, block_tables[b], seq_len, k_scale, v_scale)
        out[start:end] = attend_ref(q[start:end], k, v, seq_len - (end - start), scale,
                                     sliding_window, soft_cap).to(q.dtype)
    return out


if tl is not None:
    # Mixed steps pass the metadata of the sequences after the leading decodes as views
    # (query_start_loc[decodes:] ...), 4 bytes a sequence past an aligned start.
    @kernel(unaligned=("qsl_ptr", "seq_lens_ptr", "bt_ptr"))
    def _prefill_kernel(q_ptr, cache_ptr, out_ptr, qsl_ptr, seq_lens_ptr, bt_ptr,
                        scale_log2, window, cap_log2, q_tok_stride, q_head_stride, o_tok_stride,
                        o_head_stride, bt_stride, values_offset, num_kv_heads, group,
                        block_size, head_dim, k_scale, v_scale,
                        HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        SLIDING: tl.constexpr, SOFTCAP: tl.constexpr,
                        PRECISION: tl.constexpr, FP8: tl.constexpr):
        seq = tl.program_id(0)
        head = tl.program_id(1)
        m_block = tl.program_id(2)
        q_start = tl.load(qsl_ptr + seq)
        q_len = tl.load(qsl_ptr + seq + 1) - q_start
        if m_block * BLOCK_M < q_len:
            seq_len = tl.load(seq_lens_ptr + seq)
            context = seq_len - q_len
            kv_head = head // group
            offs_m = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
            offs_d = tl.arange(0, HEAD_DIM)
            d_mask = offs_d < head_dim
            q_rows = (q_start + offs_m).to(tl.int64)
            q = tl.load(q_ptr + q_rows[:, None] * q_tok_stride + head * q_head_stride
                        + offs_d[None, :], mask=(offs_m < q_len)[:, None] & d_mask[None, :],
                        other=0.0)
            q_pos = context + offs_m
            # Causal: this tile's last query sees keys up to its own position.
            hi = tl.minimum(seq_len, context + (m_block + 1) * BLOCK_M)
            lo = 0
            if SLIDING:
                lo = tl.maximum(0, context + m_block * BLOCK_M - window + 1)
                lo = (lo // BLOCK_N) * BLOCK_N

            m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
            l_i = tl.zeros([BLOCK_M], tl.float32)
            acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
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
                if FP8:
                    k = k.to(tl.float32) * k_scale
                k = k.to(q.dtype)
                s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale_log2
                if SOFTCAP:   # C*tanh(x/C) on the log2(e)-scaled scores: cap_log2 = C*log2(e)
                    s = cap_log2 * (1.0 - 2.0 / (tl.exp(2.0 * s / cap_log2) + 1.0))
                visible = (offs_n[None, :] <= q_pos[:, None]) & n_mask[None, :]
                if SLIDING:
                    visible = visible & ((q_pos[:, None] - offs_n[None, :]) < window)
                s = tl.where(visible, s, float("-inf"))
                m_new = tl.maximum(m_i, tl.max(s, axis=1))
                m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
                p = tl.exp2(s - m_safe[:, None])
                alpha = tl.exp2(m_i - m_safe)
                l_i = l_i * alpha + tl.sum(p, axis=1)
                v = tl.load(cache_ptr + values_offset + kv_off, mask=kv_mask, other=0.0)
                if FP8:
                    v = v.to(tl.float32) * v_scale
                v = v.to(q.dtype)
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
                m_i = m_new
            l_safe = tl.where(l_i == 0.0, 1.0, l_i)
            out = acc / l_safe[:, None]
            tl.store(out_ptr + q_rows[:, None] * o_tok_stride + head * o_head_stride
                     + offs_d[None, :], out.to(out_ptr.dtype.element_ty),
                     mask=(offs_m < q_len)[:, None] & d_mask[None, :])


def _prefill_tiles(q: torch.Tensor) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps): small tiles under the interpreter, tuned on CUDA."""
    if not q.is_cuda:
        return 16, 16, 4
    return 64, 64, 4


def paged_attention_prefill_triton(q: torch.Tensor, kv_cache: torch.Tensor,
                                   query_start_loc: torch.Tensor, seq_lens: torch.Tensor,
                                   block_tables: torch.Tensor, scale: float,
                                   sliding_window: int | None = None,
                                   max_query_len: int | None = None,
                                   out: torch.Tensor | None = None,
                                   soft_cap: float | None = None, k_scale: float = 1.0,
                                   v_scale: float = 1.0) -> torch.Tensor:
    """``max_query_len`` (a host int) sizes the grid; computed with a sync when omitted."""
    check_paged_inputs(q, kv_cache, seq_lens, block_tables)
    out = torch.empty_like(q) if out is None else out
    num_seqs = seq_lens.shape[0]
    if max_query_len is None:
        max_query_len = int((query_start_loc[1:] - query_start_loc[:-1]).max()) if num_seqs else 0
    if num_seqs == 0 or max_query_len == 0:
        return out
    _, _, block_size, num_kv_heads, head_dim = kv_cache.shape
    block_m, block_n, warps = _prefill_tiles(q)
    grid = (num_seqs, q.shape[1], triton.cdiv(max_query_len, block_m))
    _prefill_kernel[grid](
        q, kv_cache, out, query_start_loc, seq_lens, block_tables,
        scale * math.log2(math.e), sliding_window or 0, (soft_cap or 1.0) * math.log2(math.e),
        q.stride(0), q.stride(1),
        out.stride(0), out.stride(1), block_tables.stride(0), kv_cache[0].numel(),
        num_kv_heads, q.shape[1] // num_kv_heads, block_size, head_dim, float(k_scale),
        float(v_scale), HEAD_DIM=next_power_of_2(max(16, head_dim)), BLOCK_M=block_m,
        BLOCK_N=block_n, SLIDING=sliding_window is not None, SOFTCAP=soft_cap is not None,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32", FP8=is_fp8(kv_cache.dtype),
        num_warps=warps, num_stages=2)
    return out


def paged_attention_prefill(q: torch.Tensor, kv_cache: torch.Tensor,
                            query_start_loc: torch.Tensor, seq_lens: torch.Tensor,
                            block_tables: torch.Tensor, scale: float,
                            sliding_window: int | None = None,
                            max_query_len: int | None = None,
                            soft_cap: float | None = None, k_scale: float = 1.0,
                            v_scale: float = 1.0) -> torch.Tensor:
    """Triton on CUDA, the reference elsewhere (see the module docstring)."""
    scales = dict(k_scale=k_scale, v_scale=v_scale)
    if use_triton(q):
        return paged_attention_prefill_triton(q, kv_cache, query_start_loc, seq_lens,
                                              block_tables, scale, sliding_window, max_query_len,
                                              soft_cap=soft_cap, **scales)
    return paged_attention_prefill_ref(q, kv_cache, query_start_loc, seq_lens, block_tables,
                                       scale, sliding_window, soft_cap, **scales)
