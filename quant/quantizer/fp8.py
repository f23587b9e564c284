"""FP8 (e4m3) weights with one scale per tensor, rounded by GPTQ's error feedback.

The scale maps the tensor's max |w| to 448 (e4m3's largest value), as round-to-nearest
does; GPTQ then picks each column's FP8 values so that the layer's output error on the
calibration inputs is small, instead of each weight's own error. Per-tensor scales keep
the checkpoint in the layout every FP8 loader reads (``quant_method: fp8``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from tamis.kernels.fp8 import FP8_DTYPE, quantize_fp8
from tamis.quant.fp8 import quantize_weight_per_tensor
from tamis.quant.quantizer.gptq import gptq_solve, visiting_order


@dataclass
class Fp8Weight:
    weight: torch.Tensor  # float8 [N, K]
    scale: torch.Tensor   # float32 scalar

    def dequantize(self) -> torch.Tensor:
        return self.weight.float() * self.scale


def rtn_fp8(weight: torch.Tensor) -> Fp8Weight:
    return Fp8Weight(*quantize_weight_per_tensor(weight))


def gptq_fp8(weight: torch.Tensor, hessian: torch.Tensor, act_order: bool = True,
             damp: float = 0.01) -> Fp8Weight:
    """weight [N, K]; hessian [K, K] of the layer's inputs."""
    scale = rtn_fp8(weight).scale
    codes = torch.empty(weight.shape, dtype=torch.float32)

    def round_column(position: int, column: torch.Tensor, _pending) -> torch.Tensor:
        q = quantize_fp8(column, scale).float()
        codes[:, position] = q
        return q * scale

    perm = visiting_order(hessian, act_order)
    gptq_solve(weight, hessian, perm, round_column, damp)
    inverse = torch.argsort(perm)
    return Fp8Weight(codes[:, inverse].to(FP8_DTYPE).contiguous(), scale)
