"""Activations of the MLP block."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SiluAndMul(nn.Module):
    """``[..., 2d] -> [..., d]``: silu(first half) * second half (fused gate_up output);
    one fused kernel on CUDA (``tamis.kernels.activation``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda:
            return self.forward_fused(x)
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up

    def forward_fused(self, x: torch.Tensor) -> torch.Tensor:
        """``forward`` through the kernels subpackage (Triton on CUDA, its reference elsewhere)."""
        from tamis.kernels.activation import silu_and_mul
        return silu_and_mul(x)


def get_act_and_mul(hidden_act: str) -> nn.Module:
    """The gated activation for ``config.hidden_act``; ValueError for others."""
    if hidden_act in ("silu", "swish"):
        return SiluAndMul()
    raise ValueError(f"unsupported hidden_act {hidden_act!r}: only 'silu' is implemented")
