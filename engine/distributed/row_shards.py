"""How a row-parallel layer's rank picks its input rows from a checkpoint.

Rank r of N keeps input rows ``r*K/N .. (r+1)*K/N - 1`` of every tensor along K, and the
matching whole groups of group-wise tensors (scales, zero points)::

    K rows:   [ rank 0 | rank 1 ]         g_idx  0 0 1 1 | 2 2 3 3   (groups of 2)
    groups:   [ 0  1   | 2  3   ]         rank 1 keeps groups 2, 3, renumbered 0, 1

GPTQ act-order (``desc_act``) assigns rows to groups in any order, so a contiguous K
slice would need other ranks' groups. Such a layer keeps instead the rows of its own
groups ``r*G/N .. (r+1)*G/N - 1`` wherever they lie in K; its input, split by position
among the ranks, is then all-gathered and those rows picked (``input_rows``). Which
case applies is known when the group index is loaded; tensors along K that arrive
before it wait (one layer's worth, held only until then).
"""
from __future__ import annotations

import torch
from torch import nn

from tamis.engine.distributed.sharding import Span, materialize, shape_tensor, take_span


class RowShardLoader:
    """Loads the rank's part of each checkpoint tensor of one row-parallel ``layer``."""

    def __init__(self, layer: nn.Module) -> None:
        self.layer = layer
        self.tp = layer.tp
        self.full_k, self.local_k = layer.full_input_size, layer.input_size
        params = list(layer.parameters(recurse=False))
        self.has_group_index = any(getattr(p, "group_index", False) for p in params)
        self.group_size = min((getattr(p, "group_size", None) or self.full_k for p in params),
                              default=self.full_k)
        self.rows_decided = not self.has_group_index
        self.pending: list[tuple] = []

    def load(self, inner, param: torch.Tensor, loaded, shard_id=None) -> None:
        if getattr(param, "group_index", False):
            inner(param, self._local_group_index(materialize(loaded)))
            self.rows_decided = True
            pending, self.pending = self.pending, []
            for args in pending:
                self.load(*args)
            return
        if not self.rows_decided and self._along_k_rows(param):
            self.pending.append((inner, param, materialize(loaded)))
            return
        inner(param, self._rank_part(param, loaded))

    def _along_k_rows(self, param: torch.Tensor) -> bool:
        dim = getattr(param, "input_dim", None)
        return dim is not None and getattr(param, "group_dim", None) != dim

    def _rank_part(self, param: torch.Tensor, loaded) -> torch.Tensor:
        dim = getattr(param, "input_dim", None)
        if getattr(param, "holds_shape", False):
            return shape_tensor(loaded, (self.layer.output_size, self.full_k),
                                 (self.layer.output_size, self.local_k))
        if dim is None:
            return materialize(loaded)
        rows = getattr(self.layer, "input_rows", None)
        if rows is not None and self._along_k_rows(param):
            return _select_rows(param, materialize(loaded), dim, rows.cpu(), self.full_k)
        local = param.shape[dim]
        return take_span(loaded, dim, Span(local * self.tp.size, self.tp.rank * local, local))

    def _local_group_index(self, g_idx: torch.Tensor) -> torch.Tensor:
        """The rank's rows' groups, numbered from its first group; decides act-order rows."""
        if g_idx.numel() != self.full_k:
            return g_idx   # the method's own loader refuses the shape
        start = self.tp.rank * self.local_k
        if int(g_idx.max()) == 0:
            return g_idx[start:start + self.local_k]   # one group: its scales are replicated
        num_groups = -(-self.local_k // self.group_size)
        first_group = self.tp.rank * num_groups
        local = g_idx[start:start + self.local_k].long() - first_group
        if bool((local >= 0).all() and (local < num_groups).all()):
            return local.to(g_idx.dtype)
        own = (g_idx.long() >= first_group) & (g_idx.long() < first_group + num_groups)
        rows = own.nonzero().flatten()
        if rows.numel() != self.local_k:
            raise ValueError(
                f"{self.layer.prefix}: act-order groups {first_group}.."
                f"{first_group + num_groups - 1} "
                f"hold {rows.numel()} input rows, not {self.local_k}: groups of unequal sizes "
                f"cannot be split over tensor parallel size {self.tp.size}")
        device = next(self.layer.parameters()).device
        self.layer.input_rows = rows.to(device)
        return (g_idx[rows].long() - first_group).to(g_idx.dtype)


def _select_rows(param: torch.Tensor, tensor: torch.Tensor, dim: int, rows: torch.Tensor,
                 full_k: int) -> torch.Tensor:
    """Rows ``rows`` along K of a checkpoint tensor, unpacked and repacked if it packs K."""
    if getattr(param, "packed_dim", None) != dim:
        return tensor.index_select(dim, rows)
    from tamis.quant.packing import pack_int32, unpack_int32   # quant/ only for quantized layers

    bits = 32 // param.packed_factor
    codes = unpack_int32(tensor, bits, dim=dim, length=full_k).index_select(dim, rows)
    return pack_int32(codes, bits, dim=dim)
