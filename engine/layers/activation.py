"""Activations of the MLP block."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tamis.kernels.columns import scatter_columns


class SiluAndMul(nn.Module):
    """``[..., 2d] -> [..., d]``: silu(first half) * second half (fused gate_up output);
    one fused kernel on CUDA (``tamis.kernels.activation``). After
    ``permute_output(perm)`` the result comes out as ``result[..., perm]`` (the input order
    of a GPTQ act-order down_proj, which then skips its own gather)."""

    def __init__(self):
        super().__init__()
        # Column c of the result goes to output column output_cols[c] (None: natural order).
        self.register_buffer("output_cols", None, persistent=False)

    def permute_output(self, perm: torch.Tensor) -> None:
        """From now on the result comes out as ``result[..., perm]``; perm: a permutation
        of the d output columns."""
        if perm.dim() != 1:
            raise ValueError(f"perm must be 1-D, got shape {tuple(perm.shape)}")
        self.output_cols = torch.argsort(perm).to(torch.int64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda:
            return self.forward_fused(x)
        gate, up = x.chunk(2, dim=-1)
        return scatter_columns(F.silu(gate) * up, self.output_cols)

    def forward_fused(self, x: torch.Tensor) -> torch.Tensor:
        """``forward`` through the kernels subpackage (Triton on CUDA, its reference elsewhere)."""
        from tamis.kernels.activation import silu_and_mul
        return silu_and_mul(x, self.output_cols)


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
