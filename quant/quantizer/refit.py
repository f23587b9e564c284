"""Least-squares refit of a quantized weight's scales, its codes and zero points fixed.

GPTQ fixes each group's grid before it rounds the group (on the error-updated weights,
by a clipping search), then chooses the codes. Once the codes are known, the scales that
minimize the layer's output error on the calibration inputs,

    sum_n (w_n - (c_n - z_n) s_n) H (w_n - (c_n - z_n) s_n)^T,   H = 2/T sum x^T x,

are one small linear least-squares problem per output row (one unknown per group, the
groups' blocks of H coupling them). The refit can only lower that error for the given
codes; GPTQ can then re-round with the new grids held fixed.
"""
from __future__ import annotations

import torch

from tamis.quant.quantizer.grid import QuantizedWeight


@torch.no_grad()
def refit_scales(weight: torch.Tensor, hessian: torch.Tensor, quantized: QuantizedWeight
                 ) -> QuantizedWeight:
    """``quantized`` with its scales [N, G] replaced by the least-squares optimum under
    ``hessian`` [K, K] (rounded to float16, the stored dtype); a scale whose solution is
    not positive and finite keeps its old value. Codes, zeros and ``g_idx`` are shared."""
    # The products over K (O(N K^2), the whole cost) in float32, the G x G solves in
    # float64: the sums are as accurate as the float32 Hessian they read, and the scales
    # are rounded to float16 after.
    w = weight.float()
    h = hessian.float()
    g_idx = quantized.g_idx.long()
    groups = quantized.scales.shape[1]
    a = quantized.codes.float() - quantized.zeros.float()[:, g_idx]  # [N, K]
    n, device = a.shape[0], a.device
    members = [torch.nonzero(g_idx == g).flatten() for g in range(groups)]
    normal = torch.zeros(n, groups, groups, dtype=torch.float64, device=device)
    rhs = torch.zeros(n, groups, device=device).index_add_(1, g_idx, a * (w @ h)).double()
    for g, cols in enumerate(members):
        # (a restricted to group g) @ H: row n's coupling of group g with every column.
        coupled = a[:, cols] @ h[cols]  # [N, K]
        normal[:, g] = torch.zeros(n, groups, device=device).index_add_(
            1, g_idx, coupled.mul_(a)).double()
    old = quantized.scales.to(torch.float64)
    # A tiny ridge towards the old scales keeps empty or all-zero-code groups solvable.
    ridge = 1e-9 * normal.diagonal(dim1=1, dim2=2).mean(dim=1).clamp(min=1e-30)[:, None, None]
    eye = torch.eye(groups, dtype=torch.float64, device=device)
    solved = torch.linalg.solve(normal + ridge * eye, rhs + ridge[:, :, 0] * old)
    new = solved.to(torch.float32).half().float()
    keep = ~(torch.isfinite(new) & (new > 0))
    scales = torch.where(keep, quantized.scales, new)
    return QuantizedWeight(quantized.codes, scales, quantized.zeros, quantized.g_idx,
                           quantized.bits, quantized.group_size)

