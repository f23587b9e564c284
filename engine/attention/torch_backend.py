"""Paged attention in plain torch: correct everywhere, fast enough on CPU.

Decode tokens (query length 1) of all sequences are attended in one batched SDPA call
over keys gathered from their block tables (padded to the longest, masked). Prefill
chunks (query length > 1) run one SDPA call per sequence over its cached prefix and
new tokens.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from tamis.engine.attention.backends import AttentionBackend
from tamis.engine.attention.metadata import AttentionMetadata
from tamis.kernels.kv_quant import dequantize_kv, is_fp8, quantize_kv


def store_kv(k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
             slot_mapping: torch.Tensor, k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    """Writes k/v [T, Hkv, D] into their slots (an FP8 cache gets ``k / k_scale`` and
    ``v / v_scale``); tokens with slot -1 are skipped."""
    num_slots = kv_cache.shape[1] * kv_cache.shape[2]
    key_cache = kv_cache[0].view(num_slots, *kv_cache.shape[3:])
    value_cache = kv_cache[1].view(num_slots, *kv_cache.shape[3:])
    slots = slot_mapping.long()
    valid = slots >= 0
    if not bool(valid.all()):
        slots, k, v = slots[valid], k[valid], v[valid]
    k, v = quantize_kv(k, k_scale, kv_cache.dtype), quantize_kv(v, v_scale, kv_cache.dtype)
    if is_fp8(kv_cache.dtype):   # index_copy_ has no float8 kernel on CPU: copy the bytes
        key_cache, value_cache, k, v = (t.view(torch.uint8) for t in (key_cache, value_cache, k, v))
    key_cache.index_copy_(0, slots, k)
    value_cache.index_copy_(0, slots, v)


def gather_kv(kv_cache: torch.Tensor, block_tables: torch.Tensor, num_tokens: int,
              k_scale: float = 1.0, v_scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values of the first ``num_tokens`` positions of each block table row:
    block_tables [B, nb] -> k, v [B, num_tokens, Hkv, D] (one gather for both), in the
    cache's dtype, or dequantized to float32 from an FP8 cache."""
    block_size = kv_cache.shape[2]
    num_blocks = -(-num_tokens // block_size)
    blocks = block_tables[:, :num_blocks].long()
    kv = kv_cache[:, blocks].flatten(2, 3)[:, :, :num_tokens]
    if is_fp8(kv_cache.dtype):
        return dequantize_kv(kv[0], k_scale, torch.float32), dequantize_kv(kv[1], v_scale, torch.float32)
    return kv[0], kv[1]


def visible_mask(query_pos: torch.Tensor, key_pos: torch.Tensor, seq_lens: torch.Tensor,
                 sliding_window: int | None) -> torch.Tensor:
    """bool [B, Q, K]: key j is visible to query i (causal, inside the window, < seq_len)."""
    q = query_pos[:, :, None]
    kpos = key_pos[None, None, :]
    mask = (kpos <= q) & (kpos < seq_lens[:, None, None])
    if sliding_window is not None:
        mask &= kpos > q - sliding_window
    return mask


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
          scale: float, is_causal: bool = False, soft_cap: float | None = None) -> torch.Tensor:
    """q [B, Q, Hq, D], k/v [B, K, Hkv, D], mask [B, Q, K] -> [B, Q, Hq, D] in q's dtype
    (a cache stored in another dtype is cast up/down to it)."""
    k, v = k.to(q.dtype), v.to(q.dtype)
    if soft_cap is not None:   # SDPA has no hook between the scores and the softmax
        return _softcapped_attention(q, k, v, mask, scale, soft_cap)
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
        attn_mask=None if mask is None else mask[:, None], is_causal=is_causal, scale=scale,
        enable_gqa=q.shape[2] != k.shape[2])
    return out.transpose(1, 2)


def _softcapped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          mask: torch.Tensor | None, scale: float,
                          soft_cap: float) -> torch.Tensor:
    """``_sdpa`` with scores ``soft_cap * tanh(scale * q.k / soft_cap)``, in transformers'
    eager order (softmax in float32, cast to q's dtype before the product with v).
    ``mask=None`` means causal over equal query and key counts."""
    group = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    scores = torch.tanh(scores / soft_cap) * soft_cap
    if mask is None:
        mask = torch.ones(q.shape[1], k.shape[1], dtype=torch.bool, device=q.device).tril()[None]
    scores = scores.masked_fill(~mask[:, None], float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.einsum("bhqk,bkhd->bqhd", probs, v)


def host_lengths(meta: AttentionMetadata) -> tuple[list[int], list[int]]:
    """(query lengths, sequence lengths) as Python lists, from the host copies if filled."""
    query_lens = meta.query_lens_cpu or (meta.query_start_loc[1:] - meta.query_start_loc[:-1]).tolist()
    return query_lens, meta.seq_lens_cpu or meta.seq_lens.tolist()


class TorchAttentionBackend(AttentionBackend):
    name = "torch"

    def forward(self, q, k, v, kv_cache, meta: AttentionMetadata, scale: float,
                sliding_window: int | None = None, soft_cap: float | None = None,
                k_scale: float = 1.0, v_scale: float = 1.0) -> torch.Tensor:
        if kv_cache is None:
            return self._forward_uncached(q, k, v, meta, scale, sliding_window, soft_cap)
        store_kv(k, v, kv_cache, meta.slot_mapping, k_scale, v_scale)
        query_lens, seq_lens = host_lengths(meta)
        out = torch.empty_like(q)
        scales = (k_scale, v_scale)
        decodes = [b for b, n in enumerate(query_lens) if n == 1]
        if decodes:
            self._decode(q, kv_cache, meta, decodes, seq_lens, scale, sliding_window, soft_cap,
                         out, scales)
        # A fresh prefill reads its keys straight from k/v (the cache holds the same
        # values when its dtype matches); a chunk over a cached prefix gathers them.
        direct = kv_cache.dtype == k.dtype
        start = 0
        for b, (q_len, seq_len) in enumerate(zip(query_lens, seq_lens)):
            end = start + q_len
            if q_len > 1 and direct and seq_len == q_len:
                out[start:end] = self._attend_chunk(q[start:end], k[start:end], v[start:end], 0,
                                                    scale, sliding_window, soft_cap)
            elif q_len > 1:
                k_all, v_all = gather_kv(kv_cache, meta.block_tables[b:b + 1], seq_len, *scales)
                out[start:end] = self._attend_chunk(q[start:end], k_all[0], v_all[0],
                                                    seq_len - q_len, scale, sliding_window,
                                                    soft_cap)
            start = end
        return out

    def _decode(self, q, kv_cache, meta, decodes: list[int], seq_lens: list[int], scale: float,
                sliding_window: int | None, soft_cap: float | None, out: torch.Tensor,
                scales: tuple[float, float] = (1.0, 1.0)) -> None:
        """One batched SDPA over every sequence whose query is a single token."""
        index = torch.tensor(decodes, device=q.device)
        token_index = meta.query_start_loc[index].long()
        lens = torch.tensor([seq_lens[b] for b in decodes], device=q.device)
        max_len = max(seq_lens[b] for b in decodes)
        k_all, v_all = gather_kv(kv_cache, meta.block_tables[index], max_len, *scales)
        key_pos = torch.arange(max_len, device=q.device)
        mask = visible_mask((lens - 1)[:, None], key_pos, lens, sliding_window)
        out[token_index] = _sdpa(q[token_index][:, None], k_all, v_all, mask, scale,
                                 soft_cap=soft_cap)[:, 0]

    def _attend_chunk(self, q, k_all, v_all, context_len: int, scale: float,
                      sliding_window: int | None, soft_cap: float | None = None) -> torch.Tensor:
        """q [Q, Hq, D] at positions context_len.. over k/v_all [S, Hkv, D] (S = context + Q)."""
        seq_len = k_all.shape[0]
        if context_len == 0 and (sliding_window is None or sliding_window >= seq_len):
            return _sdpa(q[None], k_all[None], v_all[None], None, scale, is_causal=True,
                         soft_cap=soft_cap)[0]
        query_pos = torch.arange(context_len, seq_len, device=q.device)
        key_pos = torch.arange(seq_len, device=q.device)
        lens = torch.tensor([seq_len], device=q.device)
        mask = visible_mask(query_pos[None], key_pos, lens, sliding_window)
        return _sdpa(q[None], k_all[None], v_all[None], mask, scale, soft_cap=soft_cap)[0]

    def _forward_uncached(self, q, k, v, meta, scale, sliding_window,
                          soft_cap=None) -> torch.Tensor:
        """No KV cache: each sequence attends over its new tokens only."""
        if meta is None:
            return self._attend_chunk(q, k, v, 0, scale, sliding_window, soft_cap)
        query_lens, seq_lens = host_lengths(meta)
        out = torch.empty_like(q)
        start = 0
        for q_len, seq_len in zip(query_lens, seq_lens):
            if seq_len != q_len:
                raise ValueError("attention without a KV cache cannot attend to a cached prefix")
            end = start + q_len
            out[start:end] = self._attend_chunk(q[start:end], k[start:end], v[start:end], 0,
                                                scale, sliding_window, soft_cap)
            start = end
        return out
