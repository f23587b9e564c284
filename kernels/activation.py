"""SiLU-and-mul, the gated MLP activation: ``[..., 2d] -> [..., d] = silu(x[:d]) * x[d:]``.

Rounded as transformers' ``act_fn(gate) * up`` (and vLLM's kernel) round: silu in float32
rounded to x's dtype, then the product rounded again. Rounding once instead is no less
accurate, but it picks other bf16 values, and greedy decoding on near-tied logits then
parts from the reference implementations.

``out_cols`` (optional, int64 ``[d]``) writes output column c at ``out_cols[c]``
(``tamis.kernels.columns``): the input order of a GPTQ act-order down_proj, which then
needs no gather of its own.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from tamis.kernels import pdl
from tamis.kernels._triton import kernel, use_triton
from tamis.kernels.columns import check_out_cols, scatter_columns

try:
    import triton
    import triton.language as tl
    from tamis.kernels.pdl import gdc_launch_dependents
except ImportError:
    triton = tl = None


def _check(x: torch.Tensor) -> None:
    if x.shape[-1] % 2:
        raise ValueError(f"silu_and_mul needs an even last dim (gate and up halves), "
                         f"got {x.shape[-1]}")


def silu_and_mul_ref(x: torch.Tensor, out_cols: torch.Tensor | None = None) -> torch.Tensor:
    _check(x)
    gate, up = x.chunk(2, dim=-1)
    return scatter_columns(F.silu(gate) * up, out_cols)


if tl is not None:
    @kernel
    def _silu_and_mul_kernel(x_ptr, out_ptr, out_cols_ptr, d, x_stride,
                             HAS_OUT_COLS: tl.constexpr, BLOCK: tl.constexpr,
                             PDL_TRIGGER: tl.constexpr):
        if PDL_TRIGGER:  # the next GEMM may start loading its weights (tamis.kernels.pdl)
            gdc_launch_dependents()
        row = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < d
        gate = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
        up = tl.load(x_ptr + row * x_stride + d + cols, mask=mask, other=0.0).to(tl.float32)
        dtype = out_ptr.dtype.element_ty
        act = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
        dst = tl.load(out_cols_ptr + cols, mask=mask, other=0) if HAS_OUT_COLS else cols
        tl.store(out_ptr + row * d + dst, (act * up).to(dtype), mask=mask)


def silu_and_mul_triton(x: torch.Tensor, out_cols: torch.Tensor | None = None) -> torch.Tensor:
    _check(x)
    rows = x if x.stride(-1) == 1 else x.contiguous()
    rows = rows.reshape(-1, x.shape[-1])
    d = x.shape[-1] // 2
    out = torch.empty(rows.shape[0], d, dtype=x.dtype, device=x.device)
    if out_cols is not None:
        check_out_cols(out_cols, d, x.device)
    if rows.shape[0]:
        block = 1024
        _silu_and_mul_kernel[(rows.shape[0], triton.cdiv(d, block))](
            rows, out, rows if out_cols is None else out_cols, d, rows.stride(0),
            HAS_OUT_COLS=out_cols is not None, BLOCK=block, num_warps=4,
            PDL_TRIGGER=pdl.lets_next_launch(x.device, rows.shape[0]),
            enable_fp_fusion=False)   # see ROUNDING in _triton.py
    return out.view(*x.shape[:-1], d)


def silu_and_mul(x: torch.Tensor, out_cols: torch.Tensor | None = None) -> torch.Tensor:
    if use_triton(x):
        return silu_and_mul_triton(x, out_cols)
    return silu_and_mul_ref(x, out_cols)
