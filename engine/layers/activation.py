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


class GeluTanhAndMul(nn.Module):
    """``[..., 2d] -> [..., d]``: gelu(first half, tanh approximation) * second half
    (GeGLU, Gemma's ``gelu_pytorch_tanh``), rounded as transformers' ``act(gate) * up``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = x.chunk(2, dim=-1)
        return F.gelu(gate, approximate="tanh") * up


_ACT_AND_MUL = {"silu": SiluAndMul, "swish": SiluAndMul, "gelu_pytorch_tanh": GeluTanhAndMul}


def get_act_and_mul(hidden_act: str) -> nn.Module:
    """The gated activation for ``config.hidden_act``; ValueError for others."""
    if hidden_act not in _ACT_AND_MUL:
        raise ValueError(f"unsupported hidden_act {hidden_act!r}; supported: "
                         f"{', '.join(sorted(_ACT_AND_MUL))}")
    return _ACT_AND_MUL[hidden_act]()
