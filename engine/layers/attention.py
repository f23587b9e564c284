"""The attention layer of a decoder block: reshapes heads and calls the backend.

The KV cache of layer ``layer_idx`` is ``get_forward_context().kv_caches[layer_idx]``;
the metadata is the context's ``group_metadata[kv_group]`` (``attn_metadata`` for group 0:
every layer of most models). With ``attn_metadata is None`` (a
profiling pass or a plain forward) the T tokens are one sequence attended causally,
with no cache.

``k_scale`` / ``v_scale`` are the layer's FP8 KV-cache scales (1.0 unless the checkpoint
gives them: ``tamis.engine.attention.kv_scales``); a cache in another dtype ignores them.
With ``calculate_kv_scales`` set (``--calculate-kv-scales``) the first forward pass that
stores tokens in the cache measures them from its own keys and values before storing, and
clears the flag. Passes that store nothing (profiling, CUDA-graph capture: every slot is
-1, every sequence length 0) leave it set.

Three exact transforms come with measured scales, so that e4m3's rounding costs less:

- ``kv_rotation`` R (set with the flag, before any token is stored; ``kv_rotation.py``):
  q, k and v are multiplied by R and the output by R^T. Scores and outputs are unchanged;
  what is stored is spread evenly over the channels.
- ``key_shift`` (fixed by the measuring pass): the mean of its rotated keys per KV head and
  channel; every key is stored less it. A query's scores all move by one constant, which
  the softmax ignores, while the stored numbers shrink to their spread around the mean
  (SageAttention's smoothing of K). Soft-capped scores are not shift-invariant: those
  layers take no key shift.
- ``value_shift`` (fixed by the same pass): the mean of its rotated values per KV head and
  channel; every value is stored less it and it is added back to the output. A query's
  attention weights sum to one, so the output is unchanged; every layer takes it.

Scales are measured on what is stored (rotated, shifted), so nothing saturates in the
measuring batch.
"""
from __future__ import annotations

import torch
from torch import nn

from tamis.engine.attention.backends import AttentionBackend
from tamis.engine.attention.kv_scales import mean_over_stored, measure_scales
from tamis.engine.attention.metadata import AttentionMetadata, get_forward_context


class Attention(nn.Module):

    def __init__(self, num_heads: int, head_dim: int, num_kv_heads: int, layer_idx: int,
                 scale: float, backend: AttentionBackend, sliding_window: int | None = None,
                 soft_cap: float | None = None):
        super().__init__()
        if num_heads % num_kv_heads:
            raise ValueError(f"num_attention_heads ({num_heads}) must be a multiple of "
                             f"num_key_value_heads ({num_kv_heads})")
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.layer_idx = layer_idx
        self.kv_group = 0      # its KV-cache group: whose block tables it reads (kv_groups.py)
        self.scale = scale
        self.backend = backend
        self.sliding_window = sliding_window
        self.soft_cap = soft_cap
        self.k_scale = self.v_scale = 1.0
        self.kv_scales_from_checkpoint = False
        self.calculate_kv_scales = False
        self.kv_rotation: torch.Tensor | None = None   # [D, D], set with the flag
        self.key_shift: torch.Tensor | None = None     # [Hkv, D], set with measured scales
        self.value_shift: torch.Tensor | None = None   # [Hkv, D], set with measured scales
        self.output_shift: torch.Tensor | None = None  # [Hq, D]: value_shift per query head

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [T, Hq, D], k/v [T, Hkv, D] -> [T, Hq * D]."""
        ctx = get_forward_context()
        meta = ctx.attn_metadata
        if self.kv_group and meta is not None:
            meta = ctx.group_metadata[self.kv_group]
        kv_cache = ctx.kv_caches[self.layer_idx] if meta is not None and ctx.kv_caches else None
        rotation = self.kv_rotation
        if rotation is not None:
            q, k, v = q @ rotation, k @ rotation, v @ rotation
        if self.calculate_kv_scales and kv_cache is not None and _stores_tokens(meta):
            self._measure_kv(k, v, meta.slot_mapping)
        if self.key_shift is not None:
            k = k - self.key_shift
        if self.value_shift is not None:
            v = v - self.value_shift
        out = self.backend.forward(q, k, v, kv_cache, meta, self.scale, self.sliding_window,
                                   self.soft_cap, self.k_scale, self.v_scale)
        if self.output_shift is not None:
            out = out + self.output_shift
        if rotation is not None:
            out = out @ rotation.T
        return out.reshape(out.shape[0], self.num_heads * self.head_dim)

    def _measure_kv(self, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        """Fixes key_shift (unless soft-capped), value_shift, output_shift, k_scale and
        v_scale from this pass's (rotated) keys and values."""
        if self.soft_cap is None:
            self.key_shift = mean_over_stored(k, slot_mapping)
            k = k - self.key_shift
        self.value_shift = mean_over_stored(v, slot_mapping)
        v = v - self.value_shift
        group = self.num_heads // self.num_kv_heads
        self.output_shift = self.value_shift.repeat_interleave(group, dim=0)
        self.k_scale, self.v_scale = measure_scales(k, v, slot_mapping)
        self.calculate_kv_scales = False


def _stores_tokens(meta: AttentionMetadata) -> bool:
    """Whether a pass writes real tokens to the cache (host lengths only, no device sync)."""
    return any(meta.seq_lens_cpu) if meta.seq_lens_cpu else meta.max_seq_len > 0
