"""The clipping search of ``fit_grid``: never worse than the full-range grid on the
loss it minimizes, and strictly better on heavy-tailed rows."""
from __future__ import annotations

import pytest
import torch

from tamis.quant.quantizer.grid import fit_grid, quantize_codes, rtn_quantize


def _loss(w, scale, zero, bits, importance):
    deq = (quantize_codes(w, scale, zero, bits) - zero[:, None]) * scale[:, None]
    return ((deq - w).square() * importance).sum(dim=1)


@pytest.mark.parametrize("bits,sym", [(4, False), (4, True), (8, True)])
def test_search_never_worse_than_full_range(bits, sym):
    w = torch.randn(64, 128) * torch.rand(64, 1)
    w[:, :3] *= 8  # outliers: the full range wastes levels on them
    importance = torch.rand(128)
    full = _loss(w, *fit_grid(w, bits, sym, search=False), bits, importance)
    searched = _loss(w, *fit_grid(w, bits, sym, importance=importance), bits, importance)
    assert (searched <= full + 1e-12).all()
    if bits == 4:
        assert searched.sum() < 0.95 * full.sum()


def test_rtn_quantize_search_keeps_zero_exact_and_codes_in_range():
    w = torch.randn(16, 96)
    qw = rtn_quantize(w, 4, 64, sym=False, importance=torch.rand(96))  # 96 = 1.5 groups
    assert qw.codes.min() >= 0 and qw.codes.max() <= 15
    assert torch.equal(qw.zeros, qw.zeros.round())
    assert qw.dequantize().shape == w.shape
