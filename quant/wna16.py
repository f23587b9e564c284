"""The one weight-only integer layout every W4A16/W8A16 format is repacked into, and
the kernel each layer keeps from load on.

A format's ``process_weights_after_loading`` unpacks its checkpoint tensors into plain
integer codes and calls ``finalize_wna16(layer, codes, scales, zeros, group_size, bits,
g_idx)``. That stores, on the layer (see ``tamis.kernels.w4a16`` for the layout)::

    wna16_qweight  int32 [ceil(K/P), N]   codes packed along K (canonical words, or the
                                          interleaved order when ``wna16_interleaved``)
    wna16_scales   [G, N]                 fp16 when the checkpoint's scales are fp16-exact,
                                          else fp32
    wna16_zeros    [G, N]                 float zero points, same dtype
    wna16_perm     int64 [K] or absent    act-order: x[..., perm] feeds the kernel
    wna16_input_permuted  bool            x arrives as x[..., perm] already: its producer
                                          writes it so (``expect_permuted_input``)
    wna16_kernel                          the kernel chosen for the model's dtype and device

removes the checkpoint's tensors, and chooses the layer's kernel
(``tamis.quant.wna16_kernels``), which re-packs the weight once into its own layout.
``apply_wna16`` is then one call to that kernel.

An act-order layer whose producer can write its output in the sorted order (a norm or an
activation, ``tamis.engine.models.act_order_fusion``) is told so once after loading
(``expect_permuted_input``): its kernel then skips the per-call gather ``x[..., perm]``.

A layer moved to another device or dtype after loading chooses again, explicitly:
``select_wna16_kernel(layer, act_dtype)``. Until then ``apply_wna16`` refuses
activations of another device type or dtype than the kernel was chosen for, saying so.
"""
from __future__ import annotations

import torch
from torch import nn

from tamis.quant.base import replace_param, require
from tamis.quant.packing import pack_int32
from tamis.quant.wna16_kernels import (WNA16Kernel, choose_wna16_kernel, pending_gather,
                                       wna16_spec)

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
                   g_idx: torch.Tensor | None = None,
                   act_dtype: torch.dtype | None = None) -> None:
    """codes int [K, N] in ``[0, 2**bits)``; scales / zeros [ceil(K/group_size), N], on
    the device the layer runs on. ``act_dtype``: the activations' dtype, by default the
    layer's ``params_dtype`` (the model's compute dtype), else torch's default dtype."""
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
    layer.wna16_input_permuted = False
    layer.wna16_kernel = None
    select_wna16_kernel(layer, act_dtype or getattr(layer, "params_dtype", None)
                        or torch.get_default_dtype())


def select_wna16_kernel(layer: nn.Module, act_dtype: torch.dtype,
                        kernel: type[WNA16Kernel] | None = None) -> WNA16Kernel:
    """Choose the layer's kernel for activations of ``act_dtype`` on the device its
    weight is on now, first undoing the layout of the kernel it had (if any); with
    ``kernel``, that one or a ValueError saying why it cannot run the layer.

    ``finalize_wna16`` calls it at load; call it again after moving the layer to another
    device or dtype (or to force a kernel, as the benchmarks do)."""
    if layer.wna16_kernel is not None:
        layer.wna16_kernel.restore_weights(layer)
        layer.wna16_kernel = None
    spec = wna16_spec(layer, act_dtype)
    try:
        chosen = choose_wna16_kernel(spec, (kernel,) if kernel else None)
    except ValueError as exc:
        raise ValueError(f"{layer.prefix}: {exc}") from None
    chosen.process_weights(layer)
    layer.wna16_kernel = chosen
    return chosen


def gathered_input_perm(layer: nn.Module) -> torch.Tensor | None:
    """The permutation ``perm`` this layer's kernel gathers its input through on every
    call (``x[..., perm]``), or None: no act-order, a producer already writes x sorted,
    or the kernel reads x in the checkpoint's order (the CPU reference)."""
    kernel = getattr(layer, "wna16_kernel", None)
    if kernel is None or not kernel.reads_sorted_input:
        return None
    return pending_gather(layer)


def expect_permuted_input(layer: nn.Module) -> None:
    """From now on x reaches the layer as ``x[..., wna16_perm]`` (the caller has made its
    producer write it so); the kernel no longer gathers. ValueError without act-order."""
    require(getattr(layer, "wna16_perm", None) is not None, layer,
            "has no act-order permutation to take its input in")
    layer.wna16_input_permuted = True
    layer.wna16_kernel.input_order_changed(layer)


def apply_wna16(layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x [..., K] -> [..., N] through the layer's kernel; ValueError for activations of
    another dtype or device type than it was chosen for."""
    kernel = layer.wna16_kernel
    spec = kernel.spec
    if x.dtype != spec.act_dtype or x.device.type != spec.device.type:
        raise ValueError(f"{layer.prefix}: its W4A16 kernel was chosen at load for "
                         f"{spec.act_dtype} activations on {spec.device.type}, got "
                         f"{x.dtype} on {x.device.type}; after moving the layer call "
                         f"select_wna16_kernel(layer, act_dtype)")
    return kernel.apply(layer, x, bias)
