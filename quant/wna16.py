"""The one weight-only integer layout every W4A16/W8A16 format is repacked into.

A format's ``process_weights_after_loading`` unpacks its checkpoint tensors into plain
integer codes and calls ``finalize_wna16(layer, codes, scales, zeros, group_size, bits,
g_idx)``. That stores, on the layer (see ``tamis.kernels.w4a16`` for the layout)::

    wna16_qweight  int32 [ceil(K/P), N]   codes packed along K
    wna16_scales   [G, N]                 fp16 when the checkpoint's scales are fp16-exact, else fp32
    wna16_zeros    [G, N]                 float zero points, same dtype
    wna16_perm     int64 [K] or absent    act-order: x[..., perm] feeds the kernel

and removes the checkpoint's tensors. ``apply_wna16`` runs the dispatcher; on the CPU it
dequantizes once and keeps the dense weight (a CPU run is compute-bound on the unpack,
and memory is not the constraint there). On the first CUDA call with bf16 activations,
4-bit words are re-packed once, in place, into the MMA-fragment kernel's interleaved
nibble order (``tamis.kernels.w4a16_mma``; ``wna16_interleaved`` says so) when that
kernel takes the layer: decode batches of up to 32 rows run on it, larger ones read the
same words through the tl.dot and dequantize kernels.
"""
from __future__ import annotations

import torch
from torch import nn

from tamis.kernels.w4a16 import dequantize_wna16, w4a16_gemm
from tamis.quant.base import replace_param, require
from tamis.quant.packing import pack_int32

_CHECKPOINT_PARAMS = ("qweight", "qzeros", "scales", "g_idx", "weight_packed", "weight_scale",
                      "weight_zero_point", "weight_shape", "weight_g_idx")


def act_order_permutation(g_idx: torch.Tensor, group_size: int) -> torch.Tensor | None:
    """The row order that makes groups contiguous, or None when they already are.

    Raises ValueError unless every group holds ``group_size`` rows (the last may hold
    fewer), which is what GPTQ's act-order writes."""
    k = g_idx.numel()
    natural = torch.arange(k, device=g_idx.device) // group_size
    if torch.equal(g_idx.long(), natural):
        return None
    perm = torch.argsort(g_idx.long(), stable=True)
    if not torch.equal(g_idx.long()[perm], natural):
        raise ValueError(f"g_idx does not assign {group_size} rows to each group")
    return perm


def finalize_wna16(layer: nn.Module, codes: torch.Tensor, scales: torch.Tensor,
                   zeros: torch.Tensor, group_size: int, bits: int,
                   g_idx: torch.Tensor | None = None) -> None:
    """codes int [K, N] in ``[0, 2**bits)``; scales / zeros [ceil(K/group_size), N]."""
    k, n = codes.shape
    groups = -(-k // group_size)
    require(scales.shape == (groups, n), layer,
            f"scales have shape {tuple(scales.shape)}, expected {(groups, n)} "
            f"(K={k}, group size {group_size})")
    require(zeros.shape == (groups, n), layer,
            f"zero points have shape {tuple(zeros.shape)}, expected {(groups, n)}")
    perm = None
    if g_idx is not None:
        require(g_idx.numel() == k, layer, f"g_idx has {g_idx.numel()} entries, expected K={k}")
        require(bool((g_idx >= 0).all() and (g_idx < groups).all()), layer,
                f"g_idx values must lie in [0, {groups})")
        try:
            perm = act_order_permutation(g_idx, group_size)
        except ValueError as exc:
            raise ValueError(f"{layer.prefix}: {exc}") from None
        if perm is not None:
            codes = codes[perm]
    for name in _CHECKPOINT_PARAMS:
        if hasattr(layer, name):
            delattr(layer, name)
    exact_in_fp16 = torch.equal(scales.float().half().float(), scales.float())
    dtype = torch.float16 if exact_in_fp16 else torch.float32
    replace_param(layer, "wna16_qweight", pack_int32(codes, bits, dim=0))
    replace_param(layer, "wna16_scales", scales.to(dtype).contiguous())
    replace_param(layer, "wna16_zeros", zeros.to(dtype).contiguous())
    if perm is not None:
        layer.register_buffer("wna16_perm", perm.to(torch.int64), persistent=False)
    layer.wna16_group_size = group_size
    layer.wna16_bits = bits
    layer.wna16_in_features = k
    layer.wna16_dense = None
    layer.wna16_interleaved = False
    layer.wna16_layout_chosen = False   # the first CUDA call may re-pack (_adopt_mma_layout)


def dequantized_weight(layer: nn.Module) -> torch.Tensor:
    """The layer's weight [N, K] in float32, in the checkpoint's row order."""
    weight = dequantize_wna16(layer.wna16_qweight, layer.wna16_scales, layer.wna16_zeros,
                              layer.wna16_group_size, layer.wna16_bits, layer.wna16_in_features,
                              layer.wna16_interleaved)
    perm = getattr(layer, "wna16_perm", None)
    if perm is not None:
        unpermuted = torch.empty_like(weight)
        unpermuted[perm] = weight
        weight = unpermuted
    return weight.t()


def apply_wna16(layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    if not x.is_cuda:
        if layer.wna16_dense is None or layer.wna16_dense.dtype != x.dtype:
            layer.wna16_dense = dequantized_weight(layer).to(x.dtype).contiguous()
        return torch.nn.functional.linear(x, layer.wna16_dense, bias)
    if not layer.wna16_layout_chosen:
        _adopt_mma_layout(layer, x)
    perm = getattr(layer, "wna16_perm", None)
    if perm is not None:
        x = x[..., perm]
    out = w4a16_gemm(x, layer.wna16_qweight, layer.wna16_scales, layer.wna16_zeros,
                     layer.wna16_group_size, layer.wna16_bits, layer.wna16_interleaved)
    return out if bias is None else out + bias


def _adopt_mma_layout(layer: nn.Module, x: torch.Tensor) -> None:
    """Re-pack the words for the MMA-fragment kernel, once, when it can take the layer:
    bf16 activations and ``mma_layout_supported`` (every published format's integer zero
    points qualify)."""
    from tamis.kernels.w4a16_mma import mma_layout_supported, mma_pack
    layer.wna16_layout_chosen = True
    k = layer.wna16_in_features
    if x.dtype != torch.bfloat16 or not mma_layout_supported(
            k, layer.wna16_group_size, layer.wna16_bits, layer.wna16_zeros):
        return
    replace_param(layer, "wna16_qweight", mma_pack(layer.wna16_qweight, k))
    layer.wna16_interleaved = True
