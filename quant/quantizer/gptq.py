"""GPTQ (Frantar et al., 2022): quantize one input column at a time and spread its
rounding error over the columns not yet quantized, weighted by the inverse Hessian of the
layer's inputs (H = 2/n sum x x^T), in blocks of ``block_size`` columns (lazy batch updates).

With ``act_order`` columns are visited in decreasing order of H's diagonal; groups are
formed in that visiting order, so ``g_idx`` maps each original column to its group and
groups are no longer contiguous in K (what GPTQ checkpoints call ``desc_act``).
"""
from __future__ import annotations

import torch

from tamis.quant.quantizer.grid import QuantizedWeight, fit_grid, quantize_codes


class HessianAccumulator:
    """Running H = 2/n sum x x^T over the rows of every batch seen."""

    def __init__(self, in_features: int):
        self.hessian = torch.zeros(in_features, in_features, dtype=torch.float64)
        self.count = 0

    def add(self, x: torch.Tensor) -> None:
        x = x.reshape(-1, x.shape[-1]).to(torch.float64)
        total = self.count + x.shape[0]
        self.hessian *= self.count / total
        self.hessian += (2.0 / total) * (x.t() @ x)
        self.count = total


def gptq_quantize(weight: torch.Tensor, hessian: torch.Tensor, bits: int, group_size: int,
                  sym: bool, act_order: bool, damp: float = 0.01, block_size: int = 128,
                  min_zero: int = 0) -> QuantizedWeight:
    """weight [N, K] float; hessian [K, K]. Returns codes in the original column order."""
    w = weight.detach().to(torch.float64).clone()
    h = hessian.to(torch.float64).clone()
    n, k = w.shape
    dead = torch.diag(h) == 0
    h[dead, dead] = 1.0
    w[:, dead] = 0.0
    perm = torch.argsort(torch.diag(h), descending=True) if act_order else torch.arange(k)
    w, h = w[:, perm], h[perm][:, perm]
    h += damp * torch.mean(torch.diag(h)) * torch.eye(k, dtype=h.dtype)
    hinv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)

    group = k if group_size == -1 else group_size
    groups = -(-k // group)
    codes = torch.empty(n, k, dtype=torch.int32)
    scales, zeros = torch.empty(n, groups), torch.empty(n, groups)
    scale = zero = None
    for start in range(0, k, block_size):
        end = min(start + block_size, k)
        block = w[:, start:end].clone()
        errors = torch.zeros_like(block)
        hinv_block = hinv[start:end, start:end]
        for i in range(end - start):
            col = start + i
            if col % group == 0:
                # Fit the group on its current (error-updated) values.
                pending = torch.cat([block[:, i:], w[:, end:]], dim=1)[:, :group]
                scale, zero = fit_grid(pending, bits, sym, min_zero)
                scales[:, col // group], zeros[:, col // group] = scale, zero
            q = quantize_codes(block[:, i:i + 1], scale, zero, bits)[:, 0]
            codes[:, col] = q
            dq = (q.to(torch.float64) - zero.double()) * scale.double()
            err = (block[:, i] - dq) / hinv_block[i, i]
            block[:, i:] -= err[:, None] * hinv_block[i, i:][None, :]
            errors[:, i] = err
        w[:, end:] -= errors @ hinv[start:end, end:]

    inverse = torch.argsort(perm)
    g_idx = (inverse // group).to(torch.int32)  # column c was visited at position inverse[c]
    return QuantizedWeight(codes[:, inverse].contiguous(), scales, zeros, g_idx, bits, group_size)
