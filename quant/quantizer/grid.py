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

    def to(self, device: torch.device | str) -> "QuantizedWeight":
        """The same weight with its tensors on ``device`` (shared where already there)."""
        return QuantizedWeight(self.codes.to(device), self.scales.to(device),
                               self.zeros.to(device), self.g_idx.to(device), self.bits,
                               self.group_size)


# Clipping search: the range [lo, hi] is shrunk by each factor and the factor with the
# least (importance-weighted) squared rounding error is kept per row, like GPTQ's ``mse``
# option and AutoAWQ's clip search. Shrinking trades clipping the few extreme weights for
# a finer step on all the others.
SHRINK_FACTORS = tuple(1.0 - 0.025 * i for i in range(17))  # 1.0 ... 0.6
# Asymmetric grids shrink min and max apart as well (a 0.05 lattice of (lo, hi) factors
# besides the common ones): a skewed group keeps its long tail and gets a finer step on
# the short side. On SmolLM2 (issue 5, 16 x 512 calibration) this lowered perplexity by
# 0.15-0.66 points on three of four asymmetric rows, +0.15 on dynamic act-order
# (bench/results/quant.md).
SHRINK_PAIRS = tuple((f, f) for f in SHRINK_FACTORS) + tuple(
    (1.0 - 0.05 * i, 1.0 - 0.05 * j) for i in range(9) for j in range(9) if i != j)


def fit_grid(w: torch.Tensor, bits: int, sym: bool, min_zero: int = 0,
             importance: torch.Tensor | None = None, search: bool = True,
             hessian: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row (scale [R], zero [R]) of a grid for ``w`` [R, C] that contains 0.

    With ``search`` the grid's range is the shrink of w's [min, max] (``SHRINK_FACTORS``;
    asymmetric grids: min and max also shrunk apart, ``SHRINK_PAIRS``) minimizing
    sum_c importance[c] * (Q(w) - w)[:, c]**2 (importance [C] or [R, C], default 1), or,
    given ``hessian`` [C, C] (the inputs' x^T x over these columns),
    the full output error e H e^T of each row, e = Q(w) - w: what a row's rounding adds to
    ||x w^T||^2 on the calibration tokens, cross-channel correlations included. Without
    ``search`` it covers all of w (GPTQ's grid). Symmetric grids put the zero point at
    2**(bits-1); ``min_zero`` lifts asymmetric zero points (GPTQ's v1 format cannot store
    a zero point of 0)."""
    w = w.float()
    if not search:
        return _grid_for_range(w.amin(dim=1), w.amax(dim=1), bits, sym, min_zero)
    lo, hi = w.amin(dim=1), w.amax(dim=1)
    weight = torch.ones_like(w) if importance is None else importance.float().expand_as(w)
    hessian = None if hessian is None else hessian.float()
    best = best_loss = None
    for f_lo, f_hi in SHRINK_PAIRS if not sym else zip(SHRINK_FACTORS, SHRINK_FACTORS):
        scale, zero = _grid_for_range(lo * f_lo, hi * f_hi, bits, sym, min_zero)
        error = (quantize_codes(w, scale, zero, bits) - zero[:, None]) * scale[:, None] - w
        if hessian is None:
            loss = (error.square() * weight).sum(dim=1)
        else:
            loss = ((error @ hessian) * error).sum(dim=1)
        if best is None:
            best, best_loss = (scale, zero), loss
            continue
        better = loss < best_loss
        best = (torch.where(better, scale, best[0]), torch.where(better, zero, best[1]))
        best_loss = torch.where(better, loss, best_loss)
    return best


def _grid_for_range(lo: torch.Tensor, hi: torch.Tensor, bits: int, sym: bool,
                    min_zero: int) -> tuple[torch.Tensor, torch.Tensor]:
    maxq = 2**bits - 1
    lo, hi = torch.clamp(lo, max=0), torch.clamp(hi, min=0)
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
                 min_zero: int = 0, importance: torch.Tensor | None = None,
                 search: bool = True, hessian: torch.Tensor | None = None) -> QuantizedWeight:
    """Round-to-nearest per group of ``group_size`` input columns (-1: whole rows);
    ``importance`` [K] (e.g. the inputs' mean square) weights the clipping search, or
    ``hessian`` [K, K] (the inputs' x^T x) makes it minimize each group's output error."""
    n, k = weight.shape
    group = k if group_size == -1 else group_size
    groups = -(-k // group)
    if hessian is not None:
        return _rtn_output_error(weight, bits, group, sym, min_zero, hessian, group_size)
    # Zero padding leaves each group's grid unchanged: the grid always covers 0.
    pad = groups * group - k
    rows = torch.nn.functional.pad(weight.float(), (0, pad)).reshape(n * groups, group)
    if importance is not None:
        importance = torch.nn.functional.pad(importance.float(), (0, pad)).reshape(groups, group)
        importance = importance.repeat(n, 1)
    scale, zero = fit_grid(rows, bits, sym, min_zero, importance, search)
    codes = quantize_codes(rows, scale, zero, bits).reshape(n, groups * group)[:, :k]
    g_idx = (torch.arange(k, device=weight.device) // group).to(torch.int32)
    return QuantizedWeight(codes.contiguous(), scale.reshape(n, groups),
                           zero.reshape(n, groups), g_idx, bits, group_size)


def _rtn_output_error(weight: torch.Tensor, bits: int, group: int, sym: bool, min_zero: int,
                      hessian: torch.Tensor, group_size: int) -> QuantizedWeight:
    """``rtn_quantize`` whose clipping search weighs each group by its block of the
    Hessian (one group at a time: a [C, C] block per group, not per row)."""
    n, k = weight.shape
    codes, scales, zeros = [], [], []
    for start in range(0, k, group):
        cols = slice(start, min(start + group, k))
        w = weight[:, cols].float()
        scale, zero = fit_grid(w, bits, sym, min_zero, hessian=hessian[cols, cols])
        codes.append(quantize_codes(w, scale, zero, bits))
        scales.append(scale)
        zeros.append(zero)
    g_idx = (torch.arange(k, device=weight.device) // group).to(torch.int32)
    return QuantizedWeight(torch.cat(codes, dim=1).contiguous(), torch.stack(scales, dim=1),
                           torch.stack(zeros, dim=1), g_idx, bits, group_size)
