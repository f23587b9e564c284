"""RMSNorm with an optional fused residual add (the pre-norm pattern of Llama-like blocks)."""
from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    """``y = weight * x / sqrt(mean(x^2) + eps)``, computed in float32, returned in x's dtype.

    ``forward(x)`` returns y. ``forward(x, residual)`` first adds ``x + residual`` and
    returns ``(y, x + residual)``: the sum is the next block's residual stream.
    CUDA tensors go through the fused kernels of ``tamis.kernels.norm`` (same semantics).
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if x.is_cuda:
            from tamis.kernels.norm import fused_add_rms_norm, rms_norm
            if residual is None:
                return rms_norm(x, self.weight, self.eps)
            return fused_add_rms_norm(x, residual, self.weight, self.eps)
        if residual is None:
            return self._norm(x)
        x = x + residual
        return self._norm(x), x
