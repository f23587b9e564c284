"""RMSNorm, alone and with the residual add fused in front (Llama's pre-norm pattern).

Semantics follow transformers' LlamaRMSNorm and ``engine/layers/layernorm.py``::

    rms_norm(x, w, eps)                    = w * (x32 * rsqrt(mean(x32^2) + eps)).to(x.dtype)
    fused_add_rms_norm(x, residual, w, eps) = (rms_norm(s, w, eps), s)   with s = x + residual

The sum ``s`` is rounded to x's dtype before it is normalized, as the unfused torch code
does, so both paths see the same residual stream. Inputs are ``[..., H]`` with the last
dim contiguous; outputs are new contiguous tensors of the same shape.

``out_cols`` (optional, int64 ``[H]``) writes the normed output's column c at
``out_cols[c]`` (``tamis.kernels.columns``): the layout a GPTQ act-order consumer reads,
so it needs no gather of its own. The residual sum stays in natural order.
"""
from __future__ import annotations

import torch

from tamis.kernels import pdl
from tamis.kernels._triton import kernel, next_power_of_2, use_triton
from tamis.kernels.columns import check_out_cols, scatter_columns

try:
    import triton.language as tl
    from tamis.kernels.pdl import gdc_launch_dependents
except ImportError:
    tl = None


def _check(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None = None) -> None:
    if x.shape[-1] != weight.shape[-1] or weight.dim() != 1:
        raise ValueError(f"weight must be 1-D of size {x.shape[-1]} (x's last dim), "
                         f"got {tuple(weight.shape)}")
    if residual is not None and residual.shape != x.shape:
        raise ValueError(f"residual shape {tuple(residual.shape)} != x shape {tuple(x.shape)}")


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float,
                 out_cols: torch.Tensor | None = None) -> torch.Tensor:
    _check(x, weight)
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return scatter_columns(weight * x32.to(x.dtype), out_cols)


def fused_add_rms_norm_ref(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                           eps: float, out_cols: torch.Tensor | None = None
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    _check(x, weight, residual)
    summed = x + residual
    return rms_norm_ref(summed, weight, eps, out_cols), summed


if tl is not None:
    @kernel
    def _rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr, out_cols_ptr, hidden,
                         eps, x_stride, res_stride, HAS_RESIDUAL: tl.constexpr,
                         HAS_OUT_COLS: tl.constexpr, BLOCK: tl.constexpr,
                         PDL_TRIGGER: tl.constexpr):
        if PDL_TRIGGER:  # the next GEMM may start loading its weights (tamis.kernels.pdl)
            gdc_launch_dependents()
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        mask = cols < hidden
        x = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0)
        if HAS_RESIDUAL:
            r = tl.load(res_ptr + row * res_stride + cols, mask=mask, other=0.0)
            x = (x.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)
            tl.store(res_out_ptr + row * hidden + cols, x, mask=mask)
        x32 = x.to(tl.float32)
        inv_rms = 1.0 / tl.sqrt(tl.sum(x32 * x32, axis=0) / hidden + eps)
        normed = (x32 * inv_rms).to(x_ptr.dtype.element_ty)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0)
        out = normed.to(tl.float32) * w.to(tl.float32)
        # A scatter store, not a gathered load: the row's sum keeps its order (bit-exact).
        dst = tl.load(out_cols_ptr + cols, mask=mask, other=0) if HAS_OUT_COLS else cols
        tl.store(out_ptr + row * hidden + dst, out.to(out_ptr.dtype.element_ty), mask=mask)


def _rows(t: torch.Tensor) -> torch.Tensor:
    """``[..., H] -> [N, H]`` without a copy when only the last dim must be contiguous."""
    if t.stride(-1) != 1:
        t = t.contiguous()
    return t.reshape(-1, t.shape[-1])


def _launch(x, residual, weight, eps, out_cols):
    rows = _rows(x)
    res_rows = _rows(residual) if residual is not None else rows
    hidden = rows.shape[-1]
    out_dtype = torch.promote_types(x.dtype, weight.dtype)
    out = torch.empty(rows.shape, dtype=out_dtype, device=x.device)
    res_out = torch.empty_like(rows) if residual is not None else out
    if out_cols is not None:
        check_out_cols(out_cols, hidden, x.device)
    if rows.shape[0]:
        block = next_power_of_2(hidden)
        _rms_norm_kernel[(rows.shape[0],)](
            rows, res_rows, weight, out, res_out, rows if out_cols is None else out_cols,
            hidden, eps, rows.stride(0), res_rows.stride(0), HAS_RESIDUAL=residual is not None,
            HAS_OUT_COLS=out_cols is not None, BLOCK=block,
            PDL_TRIGGER=pdl.lets_next_launch(x.device, rows.shape[0]),
            num_warps=min(16, max(1, block // 256)),
            enable_fp_fusion=False)   # see ROUNDING in _triton.py
    return out.view(x.shape), res_out.view(x.shape)


def rms_norm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float,
                    out_cols: torch.Tensor | None = None) -> torch.Tensor:
    _check(x, weight)
    return _launch(x, None, weight, eps, out_cols)[0]


def fused_add_rms_norm_triton(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                              eps: float, out_cols: torch.Tensor | None = None
                              ) -> tuple[torch.Tensor, torch.Tensor]:
    _check(x, weight, residual)
    return _launch(x, residual, weight, eps, out_cols)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             out_cols: torch.Tensor | None = None) -> torch.Tensor:
    if use_triton(x):
        return rms_norm_triton(x, weight, eps, out_cols)
    return rms_norm_ref(x, weight, eps, out_cols)


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                       eps: float, out_cols: torch.Tensor | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns ``(rms_norm(x + residual), x + residual)``; inputs are not modified."""
    if use_triton(x):
        return fused_add_rms_norm_triton(x, residual, weight, eps, out_cols)
    return fused_add_rms_norm_ref(x, residual, weight, eps, out_cols)
