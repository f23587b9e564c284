"""Rotary position embedding applied in place to q and k.

``rotary_embedding_(positions, q, k, inv_freq, attention_scaling=1.0, is_neox=True)``

- positions: int ``[T]``; q: ``[T, Hq, D]``; k: ``[T, Hk, D]`` (views into a fused qkv
  output are fine: any token/head strides, the last dim contiguous).
- inv_freq: float32 ``[R // 2]``; the first ``R`` dims of each head rotate, the rest pass.
- angle ``= position * inv_freq`` in float32 (the product transformers forms), then
  ``cos``/``sin`` times ``attention_scaling`` rounded to q's dtype, and
  ``x1' = x1 cos - x2 sin, x2' = x2 cos + x1 sin`` with every product and sum rounded to
  q's dtype, as transformers' ``q * cos + rotate_half(q) * sin`` (and vLLM's kernel) round:
  rounding once is no less accurate but picks other bf16 values, and greedy decoding on
  near-tied logits then parts from the reference implementations.
- neox layout (Llama, Qwen, Mistral): x1 = first half of the rotary dims, x2 = second;
  GPT-J layout (``is_neox=False``): x1 = even dims, x2 = odd dims.

cos/sin are computed by torch (``rotary_cos_sin``), never inside the kernel: Triton's
``tl.cos``/``tl.sin`` lower to the GPU's approximate instructions, whose error grows with
the angle (positions x inv_freq reach 1e5 radians in long contexts) and moves bf16
roundings away from transformers'. A model computes the table once per forward pass and
passes it to every layer (``cos_sin=``).
"""
from __future__ import annotations

import torch

from tamis.kernels._triton import kernel, next_power_of_2, use_triton

try:
    import triton.language as tl
except ImportError:
    tl = None


def _check(positions, q, k, inv_freq) -> int:
    if q.dim() != 3 or k.dim() != 3 or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must be [T, heads, head_dim] with one head_dim, got "
                         f"{tuple(q.shape)} and {tuple(k.shape)}")
    if positions.dim() != 1 or positions.shape[0] != q.shape[0] or k.shape[0] != q.shape[0]:
        raise ValueError(f"positions must be [T] with T = {q.shape[0]}, got "
                         f"{tuple(positions.shape)} (k has {k.shape[0]} tokens)")
    rotary_dim = 2 * inv_freq.shape[-1]
    if inv_freq.dim() != 1 or rotary_dim > q.shape[-1]:
        raise ValueError(f"inv_freq must be 1-D with 2 * len <= head_dim {q.shape[-1]}, "
                         f"got {tuple(inv_freq.shape)}")
    if q.stride(-1) != 1 or k.stride(-1) != 1:
        raise ValueError("q and k need a contiguous last dim to be rotated in place")
    return rotary_dim


def rotary_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor, scaling: float,
                   dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin ``[T, R // 2]`` in ``dtype``: ``position * inv_freq`` in float32, cos/sin
    in float32 times ``scaling``, then rounded (transformers' order)."""
    angles = positions.float()[:, None] * inv_freq.float()[None, :]
    return (angles.cos() * scaling).to(dtype), (angles.sin() * scaling).to(dtype)


def _cos_sin(positions, inv_freq, scaling, dtype):
    cos, sin = rotary_cos_sin(positions, inv_freq, scaling, dtype)
    return cos.float()[:, None, :], sin.float()[:, None, :]


def _rotate_ref_(x: torch.Tensor, cos, sin, rotary_dim: int, is_neox: bool) -> None:
    half = rotary_dim // 2
    if is_neox:
        x1, x2 = x[..., :half], x[..., half:rotary_dim]
    else:
        x1, x2 = x[..., 0:rotary_dim:2], x[..., 1:rotary_dim:2]
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)   # every product and sum rounds to x's dtype
    new1, new2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    x1.copy_(new1)
    x2.copy_(new2)


def rotary_embedding_ref(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                         inv_freq: torch.Tensor, attention_scaling: float = 1.0,
                         is_neox: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    rotary_dim = _check(positions, q, k, inv_freq)
    cos, sin = _cos_sin(positions, inv_freq, attention_scaling, q.dtype)
    _rotate_ref_(q, cos, sin, rotary_dim, is_neox)
    _rotate_ref_(k, cos, sin, rotary_dim, is_neox)
    return q, k


if tl is not None:
    @kernel
    def _rotary_kernel(cos_ptr, sin_ptr, q_ptr, k_ptr,
                       q_tok_stride, q_head_stride, k_tok_stride, k_head_stride,
                       num_q_heads, num_k_heads, half,
                       IS_NEOX: tl.constexpr, Q_HEADS: tl.constexpr, K_HEADS: tl.constexpr,
                       HALF: tl.constexpr):
        tok = tl.program_id(0).to(tl.int64)
        i = tl.arange(0, HALF)
        in_rot = i < half
        cos = tl.load(cos_ptr + tok * half + i, mask=in_rot, other=0.0).to(tl.float32)
        sin = tl.load(sin_ptr + tok * half + i, mask=in_rot, other=0.0).to(tl.float32)
        if IS_NEOX:
            off1 = i
            off2 = i + half
        else:
            off1 = 2 * i
            off2 = 2 * i + 1

        hq = tl.arange(0, Q_HEADS)
        qmask = (hq[:, None] < num_q_heads) & in_rot[None, :]
        qbase = q_ptr + tok * q_tok_stride + hq[:, None] * q_head_stride
        dt = q_ptr.dtype.element_ty   # each product and sum rounds to it (see the docstring)
        q1 = tl.load(qbase + off1[None, :], mask=qmask, other=0.0).to(tl.float32)
        q2 = tl.load(qbase + off2[None, :], mask=qmask, other=0.0).to(tl.float32)
        q1c = (q1 * cos[None, :]).to(dt).to(tl.float32)
        q2s = (q2 * sin[None, :]).to(dt).to(tl.float32)
        q2c = (q2 * cos[None, :]).to(dt).to(tl.float32)
        q1s = (q1 * sin[None, :]).to(dt).to(tl.float32)
        tl.store(qbase + off1[None, :], (q1c - q2s).to(dt), mask=qmask)
        tl.store(qbase + off2[None, :], (q2c + q1s).to(dt), mask=qmask)

        hk = tl.arange(0, K_HEADS)
        kmask = (hk[:, None] < num_k_heads) & in_rot[None, :]
        kbase = k_ptr + tok * k_tok_stride + hk[:, None] * k_head_stride
        k1 = tl.load(kbase + off1[None, :], mask=kmask, other=0.0).to(tl.float32)
        k2 = tl.load(kbase + off2[None, :], mask=kmask, other=0.0).to(tl.float32)
        k1c = (k1 * cos[None, :]).to(dt).to(tl.float32)
        k2s = (k2 * sin[None, :]).to(dt).to(tl.float32)
        k2c = (k2 * cos[None, :]).to(dt).to(tl.float32)
        k1s = (k1 * sin[None, :]).to(dt).to(tl.float32)
        tl.store(kbase + off1[None, :], (k1c - k2s).to(dt), mask=kmask)
        tl.store(kbase + off2[None, :], (k2c + k1s).to(dt), mask=kmask)


def rotary_embedding_triton(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                            inv_freq: torch.Tensor, attention_scaling: float = 1.0,
                            is_neox: bool = True,
                            cos_sin: tuple[torch.Tensor, torch.Tensor] | None = None,
                            ) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos_sin``: ``rotary_cos_sin(positions, inv_freq, attention_scaling, q.dtype)``
    when the caller has it already (computed here otherwise)."""
    rotary_dim = _check(positions, q, k, inv_freq)
    if q.shape[0] == 0:
        return q, k
    if q.dtype != k.dtype:
        raise ValueError(f"q and k must share a dtype, got {q.dtype} and {k.dtype}")
    half = rotary_dim // 2
    if cos_sin is None:
        cos_sin = rotary_cos_sin(positions, inv_freq.to(q.device), attention_scaling, q.dtype)
    cos, sin = (t.contiguous() for t in cos_sin)
    if cos.shape != (q.shape[0], half) or sin.shape != cos.shape:
        raise ValueError(f"cos/sin must be [{q.shape[0]}, {half}], got {tuple(cos.shape)}")
    _rotary_kernel[(q.shape[0],)](
        cos, sin, q, k,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), q.shape[1], k.shape[1], half,
        IS_NEOX=is_neox, Q_HEADS=next_power_of_2(q.shape[1]),
        K_HEADS=next_power_of_2(k.shape[1]), HALF=next_power_of_2(half), num_warps=4,
        enable_fp_fusion=False)   # see ROUNDING in _triton.py
    return q, k


def rotary_embedding_(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                      inv_freq: torch.Tensor, attention_scaling: float = 1.0,
                      is_neox: bool = True,
                      cos_sin: tuple[torch.Tensor, torch.Tensor] | None = None,
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotates q and k in place and returns them (Triton on CUDA, reference elsewhere)."""
    if use_triton(q):
        return rotary_embedding_triton(positions, q, k, inv_freq, attention_scaling, is_neox,
                                       cos_sin)
    return rotary_embedding_ref(positions, q, k, inv_freq, attention_scaling, is_neox)
