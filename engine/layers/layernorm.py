"""RMSNorm with an optional fused residual add (the pre-norm pattern of Llama-like blocks),
and Gemma's variant, whose checkpoint weight is the offset from 1."""
from __future__ import annotations

import torch
from torch import nn

from tamis.kernels.columns import scatter_columns


class RMSNorm(nn.Module):
    """``y = weight * x / sqrt(mean(x^2) + eps)``, computed in float32, returned in x's dtype.

    ``forward(x)`` returns y. ``forward(x, residual)`` first adds ``x + residual`` and
    returns ``(y, x + residual)``: the sum is the next block's residual stream.
    CUDA tensors go through the fused kernels of ``tamis.kernels.norm`` (same semantics)
    where ``fused_kernel`` is set.

    After ``permute_output(perm)`` y is written as ``y[..., perm]`` (the input order of a
    GPTQ act-order consumer, which then skips its own gather); the residual sum stays in
    natural order.
    """

    fused_kernel = True

    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)
        # Column c of y goes to output column output_cols[c] (None: natural order).
        self.register_buffer("output_cols", None, persistent=False)

    def permute_output(self, perm: torch.Tensor) -> None:
        """From now on y comes out as ``y[..., perm]``; perm: a permutation of the columns."""
        if perm.shape != self.weight.shape:
            raise ValueError(f"perm must have {self.weight.numel()} entries, got "
                             f"{tuple(perm.shape)}")
        self.output_cols = torch.argsort(perm).to(torch.int64)

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        # Same operations and order as transformers' LlamaRMSNorm (bit-identical results),
        # with fewer temporaries: in place on the fresh tensors only, never on x.
        dtype = x.dtype
        x32 = x.float()
        variance = x32.square().mean(-1, keepdim=True).add_(self.eps)
        y = torch.mul(x32, torch.rsqrt(variance)).to(dtype)
        if self.weight.dtype == y.dtype:
            return y.mul_(self.weight)
        return self.weight * y

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if x.is_cuda and self.fused_kernel:
            return self.forward_fused(x, residual)
        if residual is None:
            return scatter_columns(self._norm(x), self.output_cols)
        x = x + residual
        return scatter_columns(self._norm(x), self.output_cols), x

    def forward_fused(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """``forward`` through the kernels subpackage (Triton on CUDA, its reference elsewhere)."""
        from tamis.kernels.norm import fused_add_rms_norm, rms_norm
        if residual is None:
            return rms_norm(x, self.weight, self.eps, self.output_cols)
        return fused_add_rms_norm(x, residual, self.weight, self.eps, self.output_cols)


class GemmaRMSNorm(RMSNorm):
    """``y = (1 + weight) * x / sqrt(mean(x^2) + eps)``, all in float32 and rounded to x's
    dtype once at the end (transformers' Gemma 2/3 RMSNorm, which differs from Llama's in
    that rounding and in the stored offset). Same ``forward`` contract as RMSNorm; plain
    torch on every device (the fused kernels implement Llama's rounding)."""

    fused_kernel = False

    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__(hidden_size, eps)
        self.weight.data.zero_()

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * (1.0 + self.weight.float())).to(x.dtype)
