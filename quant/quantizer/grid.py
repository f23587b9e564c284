"""Integer quantization grids (scale and zero point per output row and group).

``QuantizedWeight`` is what every integer quantizer returns and every writer packs::

    codes   int32 [N, K]  in [0, 2**bits)       (checkpoint row order of K)
    scales  float32 [N, G]                      already rounded to float16, the dtype
                                                written, so the file reproduces them exactly
    zeros   float32 [N, G]                      integer zero points
    g_idx   int32 [K]                           group of each input column
    w ~ (codes - zeros[:, g_idx]) * scales[:, g_idx]
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class QuantizedWeight:
    codes: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor
    g_idx: torch.Tensor
    bits: int
    group_size: int  # -1: one group over K

    def dequantize(self) -> torch.Tensor:
        """[N, K] float32."""
        g = self.g_idx.long()
        return (self.codes.float() - self.zeros[:, g]) * self.scales[:, g]


def fit_grid(w: torch.Tensor, bits: int, sym: bool, min_zero: int = 0
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row (scale [R], zero [R]) covering ``w`` [R, C] and 0 (GPTQ's grid).

    Symmetric grids put the zero point at 2**(bits-1); ``min_zero`` lifts asymmetric
    zero points (GPTQ's v1 format cannot store a zero point of 0)."""
    maxq = 2**bits - 1
    w = w.float()
    lo = torch.clamp(w.amin(dim=1), max=0)
    hi = torch.clamp(w.amax(dim=1), min=0)
    if sym:
        hi = torch.maximum(lo.abs(), hi)
        lo = -hi
    flat = (lo == 0) & (hi == 0)
    lo, hi = torch.where(flat, -1.0, lo), torch.where(flat, 1.0, hi)
    scale = ((hi - lo) / maxq).half().float()  # what the checkpoint will store
    scale = torch.where(scale > 0, scale, torch.full_like(scale, 2**-14))
    if sym:
        zero = torch.full_like(scale, (maxq + 1) // 2)
    else:
        zero = torch.round(-lo / scale).clamp(min_zero, maxq)
    return scale, zero


def quantize_codes(w: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, bits: int
                   ) -> torch.Tensor:
    """w [R, C] on the per-row grid -> codes int32 [R, C]."""
    q = torch.round(w.float() / scale[:, None]) + zero[:, None]
    return q.clamp(0, 2**bits - 1).to(torch.int32)


def rtn_quantize(weight: torch.Tensor, bits: int, group_size: int, sym: bool,
                 min_zero: int = 0) -> QuantizedWeight:
    """Round-to-nearest per group of ``group_size`` input columns (-1: whole rows)."""
    n, k = weight.shape
    group = k if group_size == -1 else group_size
    groups = -(-k // group)
    # Zero padding leaves each group's grid unchanged: the grid always covers 0.
    padded = torch.nn.functional.pad(weight.float(), (0, groups * group - k))
    rows = padded.reshape(n * groups, group)
    scale, zero = fit_grid(rows, bits, sym, min_zero)
    codes = quantize_codes(rows, scale, zero, bits).reshape(n, groups * group)[:, :k]
    g_idx = (torch.arange(k) // group).to(torch.int32)
    return QuantizedWeight(codes.contiguous(), scale.reshape(n, groups),
                           zero.reshape(n, groups), g_idx, bits, group_size)
