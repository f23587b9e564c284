"""The kernel of a W4A16 / W8A16 linear layer, chosen once, when the layer is loaded.

After a format repacks its checkpoint into the shared layout (``tamis.quant.wna16``),
``choose_wna16_kernel`` asks the candidates below, in order, whether they can implement
the layer (``can_implement``, as vLLM's ``MPLinearKernel`` does); the first that can
re-packs the weight once into the layout it reads (``process_weights``) and serves every
forward pass (``apply``). Nothing is chosen or re-packed on the forward path.

```
InterleavedWordsKernel  CUDA sm_80+, bf16 x, 4-bit, K % 32 == 0,   interleaved words
                        groups of 32-row multiples, integer zero    (``mma_pack``)
                        points in [0, 16]
CanonicalWordsKernel    CUDA with Triton                            canonical words
ReferenceKernel         anywhere (the CPU)                          a dense weight
```

A GPU kernel then runs, for each call, one of its own launchers by the rows of x
(``route``: one table per kernel, thresholds from bench/results/quant.md).
"""
from __future__ import annotations

import contextlib
import functools
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from tamis.kernels.w4a16 import dequantize_wna16
from tamis.kernels.w4a16_common import (cuda_capability, hopper_device, integer_zero_points,
                                        tensor_core_weight_supported)
from tamis.quant.base import replace_param
from tamis.quant.packing import pack_int32

try:
    import triton
except ImportError:  # CPU-only installs: the reference only
    triton = None

MMA_DISPATCH_M = 32  # interleaved words: rows for the MMA-fragment kernel (at 64 rows it
                     # lost to tl.dot, bench/results/quant.md)
DEQUANT_MIN_M = 128  # from here on: dequantize to a dense weight, then a cuBLAS GEMM


@dataclass(frozen=True)
class WNA16Spec:
    """What a kernel's choice depends on, all known at load."""
    in_features: int              # K
    out_features: int             # N
    group_size: int
    bits: int
    act_dtype: torch.dtype        # the model's compute dtype
    device: torch.device
    integer_zero_points: bool     # every zero point an integer in [0, 16]


def wna16_spec(layer: nn.Module, act_dtype: torch.dtype) -> WNA16Spec:
    """The spec of a layer in the shared layout, on the device its weight lives on."""
    qweight = layer.wna16_qweight
    return WNA16Spec(layer.wna16_in_features, qweight.shape[1], layer.wna16_group_size,
                     layer.wna16_bits, act_dtype, qweight.device,
                     integer_zero_points(layer.wna16_zeros))


class WNA16Kernel(ABC):
    """One way to run a layer: checks, a load-time layout, a forward call."""

    def __init__(self, spec: WNA16Spec):
        ok, reason = self.can_implement(spec)
        if not ok:
            raise ValueError(f"{type(self).__name__} cannot run this layer: {reason}")
        self.spec = spec
        # Why each earlier candidate declined (filled by ``choose_wna16_kernel``).
        self.passed_over: dict[str, str] = {}

    @classmethod
    @abstractmethod
    def can_implement(cls, spec: WNA16Spec) -> tuple[bool, str | None]:
        """(True, None), or (False, what rules it out) in words a user can act on."""

    def process_weights(self, layer: nn.Module) -> None:
        """Re-pack the layer's weight into the layout ``apply`` reads (once, at load)."""

    def restore_weights(self, layer: nn.Module) -> None:
        """Undo ``process_weights``: the shared layout's canonical words again."""

    # True where the weight's rows follow the act-order sort (``wna16_perm``), so that x
    # must arrive as x[..., perm]: gathered by ``apply``, or written so by its producer.
    reads_sorted_input = False

    def input_order_changed(self, layer: nn.Module) -> None:
        """``layer.wna16_input_permuted`` has changed: adapt what the layout depends on."""

    @abstractmethod
    def apply(self, layer: nn.Module, x: torch.Tensor,
              bias: torch.Tensor | None) -> torch.Tensor:
        """x [..., K] -> [..., N] in x's dtype; x is already ``x[..., wna16_perm]`` where
        the layer's ``wna16_input_permuted`` is set (its producer writes it so)."""


class ReferenceKernel(WNA16Kernel):
    """Plain torch: the weight dequantized once to a dense [N, K] in the activation
    dtype (a CPU run is bound by the unpack, and memory is not the constraint there)."""

    @classmethod
    def can_implement(cls, spec: WNA16Spec) -> tuple[bool, str | None]:
        return True, None

    def process_weights(self, layer: nn.Module) -> None:
        dense = dequantized_weight(layer)   # the checkpoint's column order: x as it comes
        perm = getattr(layer, "wna16_perm", None)
        if perm is not None and getattr(layer, "wna16_input_permuted", False):
            dense = dense[:, perm]
        layer.wna16_dense = dense.to(self.spec.act_dtype).contiguous()

    def restore_weights(self, layer: nn.Module) -> None:
        layer.wna16_dense = None

    def input_order_changed(self, layer: nn.Module) -> None:
        self.process_weights(layer)

    def apply(self, layer, x, bias):
        return torch.nn.functional.linear(x, layer.wna16_dense, bias)


class _TritonWordsKernel(WNA16Kernel):
    """A GPU kernel: x in the weight's sorted row order (``sorted_input``), then the
    launcher ``route`` names for the rows of x (``launchers``: name -> f(x2d, qweight,
    scales, zeros, group_size))."""

    launchers: dict[str, Callable[..., torch.Tensor]]
    reads_sorted_input = True

    @abstractmethod
    def route(self, m: int) -> str:
        """The launcher for m rows of x."""

    @staticmethod
    def sorted_input(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """x in the act-order sort: x itself without act-order or where the producer wrote
        it sorted (``wna16_input_permuted``), else a gather ``x[..., wna16_perm]``."""
        perm = pending_gather(layer)
        return x if perm is None else x[..., perm]

    def apply(self, layer, x, bias):
        x = self.sorted_input(layer, x)
        x2 = x.reshape(-1, x.shape[-1])
        out = self.launchers[self.route(x2.shape[0])](
            x2, layer.wna16_qweight, layer.wna16_scales, layer.wna16_zeros,
            layer.wna16_group_size)
        out = out.reshape(*x.shape[:-1], out.shape[-1])
        return out if bias is None else out + bias


def pending_gather(layer: nn.Module) -> torch.Tensor | None:
    """``wna16_perm`` when a kernel that reads sorted input must still gather x through it
    (act-order, and no producer writes x sorted), else None."""
    if getattr(layer, "wna16_input_permuted", False):
        return None
    return getattr(layer, "wna16_perm", None)


def _needs_triton_on_cuda(spec: WNA16Spec) -> str | None:
    if spec.device.type != "cuda":
        return f"needs a CUDA device, the weight is on {spec.device}"
    if triton is None:
        return "needs triton installed"
    return None


class CanonicalWordsKernel(_TritonWordsKernel):
    """Canonical words on any CUDA GPU and activation dtype: the packed-arithmetic GEMV
    for one row (4-bit, bf16/fp16 x, groups of whole 4-word blocks), else the fp32
    GEMV for one row; tl.dot below ``DEQUANT_MIN_M`` rows (from two rows tl.dot with
    split-K is as fast as a GEMV or faster, bench/results/quant.md), dequantize +
    cuBLAS above."""

    @classmethod
    def can_implement(cls, spec):
        reason = _needs_triton_on_cuda(spec)
        return reason is None, reason

    def __init__(self, spec: WNA16Spec):
        super().__init__(spec)
        from tamis.kernels.w4a16 import w4a16_gemm_dequant, w4a16_gemm_triton
        from tamis.kernels.w4a16_gemv import gemv_supported, w4a16_gemv_triton
        from tamis.kernels.w4a16_gemv_packed import packed_gemv_supported, w4a16_gemv_packed
        k, group, bits = spec.in_features, spec.group_size, spec.bits
        self.packed_gemv = packed_gemv_supported(1, k, group, bits, spec.act_dtype)
        self.gemv = gemv_supported(k, group, bits)
        self.launchers = {name: functools.partial(fn, bits=bits) for name, fn in (
            ("packed_gemv", w4a16_gemv_packed), ("gemv", w4a16_gemv_triton),
            ("tl_dot", w4a16_gemm_triton), ("dequant", w4a16_gemm_dequant))}

    def route(self, m: int) -> str:
        if m == 1 and self.packed_gemv:
            return "packed_gemv"
        if m == 1 and self.gemv:
            return "gemv"
        return "dequant" if m >= DEQUANT_MIN_M else "tl_dot"


class InterleavedWordsKernel(_TritonWordsKernel):
    """4-bit words in the tensor-core kernels' interleaved order (``mma_pack``), bf16
    activations. On a Hopper GPU the TMA-fed wgmma kernel where ``tma_dispatch`` sends
    the rows (17..256; 9..256 on layers narrower than 8192 columns) and the shape allows,
    else the cp.async wgmma kernel where ``wgmma_dispatch`` says (17..32 rows; to 64 on
    wide or deep layers); elsewhere (and on Hopper below those rows) the MMA-fragment
    kernel up to ``MMA_DISPATCH_M`` rows; then tl.dot, and dequantize + cuBLAS from
    ``DEQUANT_MIN_M``, on the same words."""

    @classmethod
    def can_implement(cls, spec):
        reason = _needs_triton_on_cuda(spec)
        if reason is None:
            reason = _interleaved_rules_out(spec)
        return reason is None, reason

    def __init__(self, spec: WNA16Spec):
        super().__init__(spec)
        from tamis.kernels.w4a16 import w4a16_gemm_dequant, w4a16_gemm_triton
        from tamis.kernels.w4a16_mma import w4a16_gemm_mma
        from tamis.kernels.w4a16_wgmma import w4a16_gemm_wgmma, wgmma_dispatch
        from tamis.kernels.w4a16_wgmma_tma import (tma_dispatch, tma_supported,
                                                   w4a16_gemm_wgmma_tma)
        self.hopper = hopper_device(spec.device)
        self.tma_shape = tma_supported(1, spec.out_features, spec.in_features, spec.group_size)
        self._tma_dispatch, self._wgmma_dispatch = tma_dispatch, wgmma_dispatch
        self.launchers = {
            "tma_wgmma": w4a16_gemm_wgmma_tma, "wgmma": w4a16_gemm_wgmma, "mma": w4a16_gemm_mma,
            "tl_dot": functools.partial(w4a16_gemm_triton, bits=4, interleaved=True),
            "dequant": functools.partial(w4a16_gemm_dequant, bits=4, interleaved=True)}

    def route(self, m: int) -> str:
        n, k = self.spec.out_features, self.spec.in_features
        if self.hopper and self.tma_shape and self._tma_dispatch(m, n):
            return "tma_wgmma"
        if self.hopper and self._wgmma_dispatch(m, n, k):
            return "wgmma"
        if m <= MMA_DISPATCH_M:
            return "mma"
        return "dequant" if m >= DEQUANT_MIN_M else "tl_dot"

    def process_weights(self, layer: nn.Module) -> None:
        from tamis.kernels.w4a16_mma import mma_pack
        replace_param(layer, "wna16_qweight", mma_pack(layer.wna16_qweight,
                                                       self.spec.in_features))
        layer.wna16_interleaved = True

    def restore_weights(self, layer: nn.Module) -> None:
        from tamis.kernels.w4a16_mma import mma_unpack
        codes = mma_unpack(layer.wna16_qweight, self.spec.in_features)
        replace_param(layer, "wna16_qweight", pack_int32(codes, 4, dim=0))
        layer.wna16_interleaved = False


def _interleaved_rules_out(spec: WNA16Spec) -> str | None:
    """What keeps a CUDA layer off the interleaved kernels, or None."""
    if spec.act_dtype != torch.bfloat16:
        return f"needs bf16 activations, the model runs in {spec.act_dtype}"
    capability = cuda_capability(spec.device)
    if capability < (8, 0):
        return f"needs compute capability 8.0 or later (mma.sync), {spec.device} has {capability}"
    if not tensor_core_weight_supported(spec.in_features, spec.group_size, spec.bits):
        return (f"needs triton with Gluon, 4-bit codes, K % 32 == 0 and groups of a multiple "
                f"of 32 rows; got {spec.bits} bits, K={spec.in_features}, "
                f"group size {spec.group_size}")
    if not spec.integer_zero_points:
        return "needs integer zero points in [0, 16]"
    return None


KERNELS: tuple[type[WNA16Kernel], ...] = (InterleavedWordsKernel, CanonicalWordsKernel,
                                          ReferenceKernel)
# The families by the names the benchmarks take (``--kernel``, ``--w4a16-kernels``).
FAMILIES: dict[str, type[WNA16Kernel]] = {"interleaved": InterleavedWordsKernel,
                                          "canonical": CanonicalWordsKernel,
                                          "reference": ReferenceKernel}
_only: tuple[type[WNA16Kernel], ...] | None = None


@contextlib.contextmanager
def only_kernels(*families: type[WNA16Kernel]):
    """Layers loaded inside the block choose among ``families`` only, in that order (how
    a benchmark times one kernel family end to end, CUDA graphs included)."""
    global _only
    before, _only = _only, families
    try:
        yield
    finally:
        _only = before


def choose_wna16_kernel(spec: WNA16Spec,
                        candidates: tuple[type[WNA16Kernel], ...] | None = None) -> WNA16Kernel:
    """The first of ``candidates`` (default ``KERNELS``, or those of ``only_kernels``)
    that can implement ``spec``, with the others' reasons in its ``passed_over``. Raises
    ValueError listing every reason when none can."""
    candidates = candidates or _only or KERNELS
    passed_over: dict[str, str] = {}
    for kernel_cls in candidates:
        ok, reason = kernel_cls.can_implement(spec)
        if ok:
            kernel = kernel_cls(spec)
            kernel.passed_over = passed_over
            return kernel
        passed_over[kernel_cls.__name__] = reason
    raise ValueError("no W4A16 kernel can run this layer: " + "; ".join(
        f"{name} {reason}" for name, reason in passed_over.items()))


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
