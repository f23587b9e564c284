"""Coordinate descent on the codes of a quantized weight, its grids fixed.

The layer's output error on the calibration inputs is, per output row n,
``e_n H e_n^T`` with e = W - Q the rounding error and H = 2/T sum x^T x. With every other
column fixed, column j's best value is Q_j + (e H)_j / H_jj; rounding that onto each row's
grid and updating e H by the change (a rank-one update) is one coordinate step. A sweep
visits every column once; no step raises the error (QuantEase-style cyclic descent after
GPTQ's single greedy pass).
"""
from __future__ import annotations

import torch

from tamis.quant.quantizer.grid import QuantizedWeight


@torch.no_grad()
def descend_codes(weight: torch.Tensor, hessian: torch.Tensor, quantized: QuantizedWeight,
                  sweeps: int = 1) -> QuantizedWeight:
    """``quantized`` with its codes improved by ``sweeps`` cyclic sweeps (same scales, zeros
    and ``g_idx``; only the codes change)."""
    w = weight.float()
    h = hessian.float()
    g = quantized.g_idx.long()
    scale, zero = quantized.scales[:, g], quantized.zeros[:, g]  # [N, K]
    maxq = 2**quantized.bits - 1
    codes = quantized.codes.clone()
    error = w - (codes.float() - zero) * scale
    gradient = error @ h  # (e H), kept current by rank-one updates
    diagonal = torch.diag(h)
    for _ in range(sweeps):
        for j in range(w.shape[1]):
            if diagonal[j] <= 0:
                continue  # a dead input channel: its weights never reach the output
            target = w[:, j] - error[:, j] + gradient[:, j] / diagonal[j]
            code = torch.clamp(torch.round(target / scale[:, j]) + zero[:, j], 0, maxq)
            new_error = w[:, j] - (code - zero[:, j]) * scale[:, j]
            change = new_error - error[:, j]
            if not bool(change.any()):
                continue
            gradient.addr_(change, h[j])
            error[:, j] = new_error
            codes[:, j] = code.to(codes.dtype)
    return QuantizedWeight(codes, quantized.scales, quantized.zeros, quantized.g_idx,
                           quantized.bits, quantized.group_size)
