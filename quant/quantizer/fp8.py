"""FP8 (e4m3) weights with one scale per output channel, rounded by GPTQ's error feedback.

Each row's scale maps its max |w| to 448 (e4m3's largest value), as round-to-nearest
does; GPTQ then picks each column's FP8 values so that the layer's output error on the
calibration inputs is small, instead of each weight's own error. Per-channel scales are
what compressed-tensors' ``float-quantized`` format (llm-compressor's FP8_DYNAMIC) stores,
and rows stay independent, so the linears that share an input are solved in one stack.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from tamis.kernels.fp8 import FP8_DTYPE, quantize_fp8
from tamis.quant.fp8 import quantize_weight_per_channel
from tamis.quant.quantizer.gptq import gptq_solve, visiting_order


@dataclass
class Fp8Weight:
    weight: torch.Tensor  # float8 [N, K]
    scale: torch.Tensor   # float32 [N], one per output channel

    def dequantize(self) -> torch.Tensor:
        return self.weight.float() * self.scale[:, None]

    def to(self, device: torch.device | str) -> "Fp8Weight":
        """The same weight with its tensors on ``device`` (shared where already there)."""
        return Fp8Weight(self.weight.to(device), self.scale.to(device))

    def split_rows(self, rows: list[int]) -> list["Fp8Weight"]:
        """The parts of a stack of linears (``rows``: each one's output features)."""
        return [Fp8Weight(w.contiguous(), s.contiguous())
                for w, s in zip(self.weight.split(rows), self.scale.split(rows))]


def rtn_fp8(weight: torch.Tensor) -> Fp8Weight:
    return Fp8Weight(*quantize_weight_per_channel(weight))


def gptq_fp8(weight: torch.Tensor, hessian: torch.Tensor, act_order: bool = True,
             damp: float = 0.01) -> Fp8Weight:
    """weight [N, K]; hessian [K, K] of the layer's inputs."""
    scale = rtn_fp8(weight).scale
    codes = torch.empty(weight.shape, dtype=torch.float32, device=weight.device)

    def round_column(position: int, column: torch.Tensor, _pending) -> torch.Tensor:
        q = quantize_fp8(column, scale).float()
        codes[:, position] = q
        return q * scale

    perm = visiting_order(hessian, act_order)
    gptq_solve(weight, hessian, perm, round_column, damp)
    inverse = torch.argsort(perm)
    return Fp8Weight(codes[:, inverse].to(FP8_DTYPE).contiguous(), scale)
