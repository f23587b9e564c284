"""Paged attention through the Triton kernels of ``tamis.kernels`` (the CUDA backend).

One ``forward`` per layer and step:

1. ``store_kv_cache``: the step's k/v into their slots (slot -1, padding, skipped);
2. the leading run of one-query sequences (all of them in a decode-only batch, as in a
   captured CUDA graph; the running decodes ahead of new prompt chunks in a mixed
   batch) goes to the split-K decode kernel, which reads each KV head once for its
   whole query-head group; the remaining sequences go to the varlen prefill kernel.

Nothing here synchronises with the device: grid sizes come from host ints in the
metadata (``max_query_len``) or from shapes, so the decode path can be captured in a
CUDA graph. Without a KV cache (the runner's profiling pass) the new tokens attend to
each other through the torch backend.

The kernels are called directly (not through the dispatchers), so on CPU tensors they
run under the Triton interpreter: that is how the CPU tests exercise this backend.
"""
from __future__ import annotations

import torch

from tamis.engine.attention.backends import AttentionBackend
from tamis.engine.attention.metadata import AttentionMetadata
from tamis.kernels.attention_decode import paged_attention_decode_triton
from tamis.kernels.attention_prefill import paged_attention_prefill_triton
from tamis.kernels.cache import store_kv_cache_triton


def leading_decodes(query_lens: list[int]) -> int:
    """How many sequences at the front of the batch have exactly one query token
    (0 when the host lengths are not given)."""
    count = 0
    for n in query_lens:
        if n != 1:
            break
        count += 1
    return count


class TritonAttentionBackend(AttentionBackend):
    name = "triton"

    def __init__(self, decode_num_splits: int | None = None):
        """``decode_num_splits`` fixes the decode kernel's split count (None: by batch size)."""
        self.decode_num_splits = decode_num_splits
        self._uncached = None

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                kv_cache: torch.Tensor | None, meta: AttentionMetadata, scale: float,
                sliding_window: int | None = None, soft_cap: float | None = None,
                k_scale: float = 1.0, v_scale: float = 1.0) -> torch.Tensor:
        if kv_cache is None:
            return self._forward_uncached(q, k, v, meta, scale, sliding_window, soft_cap)
        store_kv_cache_triton(k, v, kv_cache, meta.slot_mapping, k_scale, v_scale)
        scales = dict(k_scale=k_scale, v_scale=v_scale)
        if meta.is_decode_only and q.shape[0] == meta.num_seqs:
            return paged_attention_decode_triton(q, kv_cache, meta.seq_lens, meta.block_tables,
                                                 scale, sliding_window,
                                                 num_splits=self.decode_num_splits,
                                                 soft_cap=soft_cap, **scales)
        out = torch.empty_like(q)
        decodes = leading_decodes(meta.query_lens_cpu)
        if decodes:   # their query rows are the first `decodes` tokens
            paged_attention_decode_triton(q[:decodes], kv_cache, meta.seq_lens[:decodes],
                                          meta.block_tables[:decodes], scale, sliding_window,
                                          num_splits=self.decode_num_splits, out=out[:decodes],
                                          soft_cap=soft_cap, **scales)
        # query_start_loc keeps absolute token offsets, so the rest needs no re-basing.
        return paged_attention_prefill_triton(
            q, kv_cache, meta.query_start_loc[decodes:], meta.seq_lens[decodes:],
            meta.block_tables[decodes:], scale, sliding_window,
            max_query_len=meta.max_query_len, out=out, soft_cap=soft_cap, **scales)

    def _forward_uncached(self, q, k, v, meta, scale, sliding_window, soft_cap) -> torch.Tensor:
        if self._uncached is None:
            from tamis.engine.attention.torch_backend import TorchAttentionBackend
            self._uncached = TorchAttentionBackend()
        return self._uncached.forward(q, k, v, None, meta, scale, sliding_window, soft_cap)
