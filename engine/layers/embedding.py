"""Token embedding and the LM head (which may share the embedding's weight).

Tensor parallelism (a model built under ``tensor_parallel(group)``, N > 1 ranks): both
are vocab-parallel. Rank r holds token rows ``r*P .. (r+1)*P - 1`` with ``P = ceil(V/N)``
(rows past V are zeros). The embedding looks up the ids in its range and the ranks' rows
are summed; the head computes its P logits per token and the logits are all-gathered, so
every rank holds the full ``[N, V]`` logits. Only rank 0 samples and applies
structured-output masks; gathering on every rank (rather than to rank 0) keeps one code
path for models that post-process logits (Gemma's soft-cap) and costs rank 0 the same.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tamis.engine.distributed.parallel_state import TPGroup, current_tp_group
from tamis.engine.distributed.sharding import materialize


def _vocab_rows(vocab_size: int, tp: TPGroup) -> tuple[int, int]:
    """(first token row, rows per rank) of rank ``tp.rank``."""
    per_rank = -(-vocab_size // tp.size)
    return tp.rank * per_rank, per_rank


def _vocab_weight(module: nn.Module, vocab_size: int, hidden_size: int) -> nn.Parameter:
    """The rank's ``[rows, hidden]`` weight; under tensor parallelism its loader keeps
    the rank's rows of the checkpoint's ``[V, hidden]`` matrix."""
    tp = module.tp
    start, rows = _vocab_rows(vocab_size, tp) if tp.is_parallel else (0, vocab_size)
    weight = nn.Parameter(torch.empty(rows, hidden_size), requires_grad=False)
    if tp.is_parallel:
        def load(param: torch.Tensor, loaded) -> None:
            if tuple(loaded.shape) != (vocab_size, hidden_size):
                raise ValueError(f"checkpoint tensor has shape {tuple(loaded.shape)}, the "
                                 f"vocabulary matrix is {(vocab_size, hidden_size)}")
            kept = max(0, min(rows, vocab_size - start))
            param.data.zero_()
            param.data[:kept].copy_(materialize(loaded.narrow(0, start, kept)))
        weight.weight_loader = load
        weight.reads_checkpoint_slices = True
    return weight


class VocabEmbedding(nn.Module):
    """``input_ids [T] -> [T, hidden]``, times ``scale`` when given (Gemma multiplies by
    sqrt(hidden), the factor first rounded to the weight's dtype as transformers does)."""

    def __init__(self, vocab_size: int, hidden_size: int, scale: float | None = None):
        super().__init__()
        self.vocab_size = vocab_size
        self.tp = current_tp_group()
        self.weight = _vocab_weight(self, vocab_size, hidden_size)
        # Rounded once to the weight's dtype; the product then rounds as transformers' does.
        self.scale = None if scale is None else float(torch.tensor(scale, dtype=self.weight.dtype))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp.is_parallel:
            embedded = self._parallel_lookup(input_ids)
        else:
            embedded = F.embedding(input_ids, self.weight)
        return embedded if self.scale is None else embedded * self.scale

    def _parallel_lookup(self, input_ids: torch.Tensor) -> torch.Tensor:
        start, rows = _vocab_rows(self.vocab_size, self.tp)
        local = input_ids - start
        outside = (local < 0) | (local >= rows)
        embedded = F.embedding(local.masked_fill(outside, 0), self.weight)
        embedded.masked_fill_(outside.unsqueeze(-1), 0.0)
        return self.tp.all_reduce(embedded)


class LMHead(nn.Module):
    """``hidden [N, H] -> float32 logits [N, vocab]``.

    With ``tie_to`` the head reuses that embedding's weight (tied embeddings): the two
    modules share one tensor, so loading either name fills both.
    """

    def __init__(self, vocab_size: int, hidden_size: int, tie_to: VocabEmbedding | None = None):
        super().__init__()
        self.vocab_size = vocab_size
        self.tp = current_tp_group()
        if tie_to is not None:
            self.weight = tie_to.weight
        else:
            self.weight = _vocab_weight(self, vocab_size, hidden_size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        from tamis.kernels.gemv import linear  # lazy, as in the other layers: no Triton at import
        logits = linear(hidden, self.weight).float()   # a split-K GEMV for one CUDA row
        if not self.tp.is_parallel:
            return logits
        return self.tp.all_gather(logits, dim=-1)[..., :self.vocab_size].contiguous()
