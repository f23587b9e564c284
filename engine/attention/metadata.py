"""The per-forward-pass batch layout every attention backend reads.

Tokens of all scheduled requests are flattened into one sequence of T tokens,
request after request (no padding between them)::

    request:      r0            r1       r2
    query tokens: [q q q q q q] [q q q]  [q]        T = 10, query_start_loc = [0, 6, 9, 10]
    cached ctx:   [c c c c]     []       [c c c c c c c]
    seq_lens:     10            3        8          (cached + new, after this step)

The KV cache of one layer is one tensor ``[2, num_blocks, block_size, num_kv_heads, head_dim]``
(index 0 = keys, 1 = values). A token's slot is ``block_id * block_size + offset``;
``slot_mapping[t] == -1`` marks a padding token whose K/V must not be stored.
``block_tables[b, i]`` is the i-th block of sequence b (rows padded with 0 past the end).
A hybrid model's KV-cache groups (``engine/kv_groups.py``) each have their own block
tables and slots over the same layout: one ``AttentionMetadata`` per group.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Iterator

import torch


@dataclass
class AttentionMetadata:
    query_start_loc: torch.Tensor   # int32 [B + 1], cumulative query lengths
    seq_lens: torch.Tensor          # int32 [B], cached + new tokens of each sequence
    block_tables: torch.Tensor      # int32 [B, max_blocks_per_seq]
    slot_mapping: torch.Tensor      # int64 [T], -1 = do not store
    max_query_len: int
    max_seq_len: int
    block_size: int
    # Host copies of the small vectors, so CPU backends need no device sync.
    query_lens_cpu: list[int] = field(default_factory=list)
    seq_lens_cpu: list[int] = field(default_factory=list)

    @property
    def num_seqs(self) -> int:
        return self.seq_lens.shape[0]

    @property
    def is_decode_only(self) -> bool:
        return self.max_query_len == 1


@dataclass
class ForwardContext:
    """What attention layers need during one forward pass; set once, never nested.
    ``group_metadata[g]`` is KV-cache group g's (its block tables and slots; the rest as
    ``attn_metadata``, which is group 0's): a layer of group g reads it."""
    attn_metadata: AttentionMetadata | None
    kv_caches: list[torch.Tensor]   # one per layer, indexed by layer_idx
    group_metadata: list[AttentionMetadata | None] = field(default_factory=list)


_current: ForwardContext | None = None


@contextlib.contextmanager
def forward_context(attn_metadata: AttentionMetadata | None, kv_caches: list[torch.Tensor],
                    group_metadata: list[AttentionMetadata] | None = None
                    ) -> Iterator[ForwardContext]:
    """Installs the context for one forward pass (``group_metadata``: one per KV-cache
    group, ``[attn_metadata]`` by default). Nesting is a bug and raises."""
    global _current
    if _current is not None:
        raise RuntimeError("forward_context is already set: forward passes must not nest")
    _current = ForwardContext(attn_metadata, kv_caches, group_metadata or [attn_metadata])
    try:
        yield _current
    finally:
        _current = None


def get_forward_context() -> ForwardContext:
    if _current is None:
        raise RuntimeError("no forward_context: call the model inside `with forward_context(...)`")
    return _current
