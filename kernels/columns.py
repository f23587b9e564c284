"""Writing an elementwise or row-wise kernel's output in another column order.

A consumer that reads its input in a fixed column order (a GPTQ act-order layer reads
``x[..., perm]``) can take it straight from its producer when the producer stores
column ``c`` of its result at ``out_cols[c]``::

    out[..., out_cols[c]] = y[..., c]     i.e.  out = y[..., perm]  with  out_cols = argsort(perm)

A scatter store leaves every value and the order it is computed in unchanged, so the
permuted output equals ``y[..., perm]`` bit for bit.
"""
from __future__ import annotations

import torch


def check_out_cols(out_cols: torch.Tensor, width: int, device: torch.device) -> None:
    """ValueError unless ``out_cols`` is an int64 vector of ``width`` entries on ``device``
    (that it is a permutation is the caller's contract: it is not checked per call)."""
    if out_cols.dim() != 1 or out_cols.numel() != width or out_cols.dtype != torch.int64:
        raise ValueError(f"out_cols must be an int64 permutation of {width} columns, got "
                         f"{out_cols.dtype} of shape {tuple(out_cols.shape)}")
    if out_cols.device != device:
        raise ValueError(f"out_cols is on {out_cols.device}, the input on {device}; "
                         f"move it with .to({str(device)!r})")


def scatter_columns(y: torch.Tensor, out_cols: torch.Tensor | None) -> torch.Tensor:
    """``y`` with column c moved to ``out_cols[c]`` (``y`` itself when out_cols is None)."""
    if out_cols is None:
        return y
    check_out_cols(out_cols, y.shape[-1], y.device)
    return torch.empty_like(y).index_copy_(-1, out_cols, y)
