"""Which part of a checkpoint tensor a tensor-parallel rank keeps.

Rank r of N keeps, of a layer ``[..., K] -> [..., N_out]``::

    column-parallel (q/k/v, gate/up, lm_head):  rows r*N_out/N .. (r+1)*N_out/N of each fused shard
    row-parallel (o_proj, down_proj):           input columns r*K/N .. (r+1)*K/N; outputs summed
    vocab-parallel embedding:                   token rows r*ceil(V/N) .. ; rows past V are zeros

Key/value heads: with at least N of them each rank keeps num_kv_heads/N; with fewer,
N/num_kv_heads consecutive ranks share (replicate) one head.

A checkpoint tensor here is a ``torch.Tensor`` or a lazy one from the loader
(``tamis.engine.loader.CheckpointSlice``): both have ``.shape`` and
``.narrow(dim, start, length)``, and ``materialize`` reads the lazy one whole, so a rank
reads only the bytes of its own slice.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Span:
    """``size`` elements from ``start`` of a dimension whose checkpoint length is ``full``."""
    full: int
    start: int
    size: int

    def scaled_down(self, factor: int) -> "Span":
        """The same span along a dimension packing ``factor`` values per element."""
        return Span(self.full // factor, self.start // factor, self.size // factor)


def split_evenly(total: int, rank: int, size: int, what: str) -> Span:
    """Rank ``rank``'s equal share of ``total``; ValueError naming ``what`` if the size
    does not divide it."""
    if total % size:
        raise ValueError(f"{what} ({total}) is not divisible by the tensor parallel size "
                         f"{size}: choose a --tensor-parallel-size that divides it")
    share = total // size
    return Span(total, rank * share, share)


def kv_head_span(num_kv_heads: int, rank: int, size: int) -> Span:
    """The key/value heads rank ``rank`` keeps (in heads, not elements)."""
    if num_kv_heads >= size:
        return split_evenly(num_kv_heads, rank, size, "num_key_value_heads")
    if size % num_kv_heads:
        raise ValueError(f"the tensor parallel size {size} is neither a divisor nor a multiple "
                         f"of num_key_value_heads ({num_kv_heads}): choose one that is")
    return Span(num_kv_heads, rank // (size // num_kv_heads), 1)


def materialize(loaded) -> torch.Tensor:
    """A checkpoint tensor as a ``torch.Tensor`` (a lazy one is read whole)."""
    return loaded if isinstance(loaded, torch.Tensor) else loaded.load()


def take_span(loaded, dim: int, span: Span) -> torch.Tensor:
    """``loaded``'s slice ``span`` along ``dim``; ``loaded`` whole (read) when its length
    there is not ``span.full`` (a per-tensor scale, or a shape the layer's own loader
    will refuse with the shape it expected)."""
    if len(loaded.shape) <= dim or loaded.shape[dim] != span.full:
        return materialize(loaded)
    return materialize(loaded.narrow(dim, span.start, span.size))


def shape_tensor(loaded, expected_full: tuple[int, int], local: tuple[int, int]) -> torch.Tensor:
    """A compressed-tensors ``weight_shape`` ([N, K] of the whole layer) as the rank's
    ``local`` shape; any other value unchanged (the layer's loader then refuses it)."""
    values = materialize(loaded)
    if tuple(values.reshape(-1).tolist()) != expected_full:
        return values
    return torch.tensor(local, dtype=values.dtype)
