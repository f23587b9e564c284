"""Token embedding and the LM head (which may share the embedding's weight)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class VocabEmbedding(nn.Module):
    """``input_ids [T] -> [T, hidden]``, times ``scale`` when given (Gemma multiplies by
    sqrt(hidden), the factor first rounded to the weight's dtype as transformers does)."""

    def __init__(self, vocab_size: int, hidden_size: int, scale: float | None = None):
        super().__init__()
        self.vocab_size = vocab_size
        self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size), requires_grad=False)
        # Rounded once to the weight's dtype; the product then rounds as transformers' does.
        self.scale = None if scale is None else float(torch.tensor(scale, dtype=self.weight.dtype))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        embedded = F.embedding(input_ids, self.weight)
        return embedded if self.scale is None else embedded * self.scale


class LMHead(nn.Module):
    """``hidden [N, H] -> float32 logits [N, vocab]``.

    With ``tie_to`` the head reuses that embedding's weight (tied embeddings): the two
    modules share one tensor, so loading either name fills both.
    """

    def __init__(self, vocab_size: int, hidden_size: int, tie_to: VocabEmbedding | None = None):
        super().__init__()
        self.vocab_size = vocab_size
        if tie_to is not None:
            self.weight = tie_to.weight
        else:
            self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size), requires_grad=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        from tamis.kernels.gemv import linear  # lazy, as in the other layers: no Triton at import
        return linear(hidden, self.weight).float()   # a split-K GEMV for one CUDA row
