"""AWQ (Lin et al., 2023): activation-aware per-input-channel scales.

For linears sharing one input x, search ``s = mean|x|^a / mean|w~|^(1-a)`` (normalized,
``a`` on a grid of 20 points in [0, 1); w~ is |w| relative to its group's max, AutoAWQ's
"duo scaling") minimizing ``|| x W^T - (x / s) Q(W * s)^T ||^2`` over calibration rows;
then W <- W * s and the op producing x absorbs 1 / s (a norm's weight, or the rows of the
preceding linear). The scaled weights are finally rounded to nearest with an asymmetric
grid (AWQ's zero-point format).
"""
from __future__ import annotations

import torch

from tamis.quant.quantizer.grid import rtn_quantize

GRID_POINTS = 20


def _pseudo_quantize(weight: torch.Tensor, bits: int, group_size: int) -> torch.Tensor:
    # Full-range grids here (no clipping search: 20x cheaper); the weights are clipped
    # once, after the scales are chosen (pipeline), as AutoAWQ does.
    return rtn_quantize(weight, bits, group_size, sym=False, search=False).dequantize()


def _weight_profile(weights: list[torch.Tensor], group_size: int) -> torch.Tensor:
    w = torch.cat(weights, dim=0).abs().float()
    n, k = w.shape
    grouped = w.reshape(n, k // group_size, group_size)
    relative = grouped / grouped.amax(dim=2, keepdim=True).clamp(min=1e-8)
    return relative.reshape(n, k).mean(dim=0)


@torch.no_grad()
def search_scales(x: torch.Tensor, weights: list[torch.Tensor], bits: int,
                  group_size: int) -> torch.Tensor:
    """x [T, K] calibration inputs; weights: the [N_i, K] linears reading x. Returns s [K]."""
    x = x.float()
    x_mean = x.abs().mean(dim=0)
    w_mean = _weight_profile(weights, group_size)
    w_all = torch.cat(weights, dim=0).float()
    reference = x @ w_all.t()
    best, best_loss = torch.ones_like(x_mean), float("inf")
    for step in range(GRID_POINTS):
        ratio = step / GRID_POINTS
        s = (x_mean.pow(ratio) / w_mean.pow(1 - ratio).clamp(min=1e-4)).clamp(min=1e-4)
        s = s / (s.max() * s.min()).sqrt()
        quantized = _pseudo_quantize(w_all * s, bits, group_size) / s
        loss = (x @ quantized.t() - reference).pow(2).mean().item()
        if loss < best_loss:
            best, best_loss = s, loss
    return best
