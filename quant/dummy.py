"""Consistent random values for quantized parameters under ``load_format="dummy"``.

The loader fills floating tensors with normal(0, 0.02) and integer tensors with 0 unless
a parameter carries ``dummy_init(tensor, generator)``; these build such functions for
the tensors whose values must agree with the layer (a GPTQ group index must give every
group its rows, compressed-tensors' ``weight_shape`` must name the layer's shape) or
whose dtype has no random fill (float8). Speed benchmarks at real shapes use them; the
resulting models compute nonsense, as dummy models do.
"""
from __future__ import annotations

from typing import Callable

import torch

DummyInit = Callable[[torch.Tensor, torch.Generator], None]
_DUMMY_STD = 0.02                     # the loader's DUMMY_STD
_FP8_SCALE = 4 * _DUMMY_STD / 448.0   # 4 standard deviations at e4m3's largest value


def group_index_init(group_size: int, act_order: bool) -> DummyInit:
    """g_idx [K]: row k in group k // group_size, rows shuffled when ``act_order``."""
    def init(tensor: torch.Tensor, generator: torch.Generator) -> None:
        k = tensor.numel()
        groups = torch.arange(k, device=tensor.device) // group_size
        if act_order:
            groups = groups[torch.randperm(k, generator=generator, device=tensor.device)]
        tensor.copy_(groups.to(tensor.dtype))
    return init


def values_init(values: list) -> DummyInit:
    """Fixed values (e.g. compressed-tensors' per-shard ``weight_shape``)."""
    def init(tensor: torch.Tensor, generator: torch.Generator) -> None:
        tensor.copy_(torch.tensor(values, dtype=tensor.dtype))
    return init


def fp8_weight_init(tensor: torch.Tensor, generator: torch.Generator) -> None:
    """float8 codes of normal(0, 0.02) weights under the scale ``fp8_scale_init`` sets."""
    weight = torch.empty(tensor.shape, dtype=torch.float32, device=tensor.device)
    weight.normal_(0.0, _DUMMY_STD, generator=generator)
    tensor.copy_((weight / _FP8_SCALE).clamp(-448.0, 448.0).to(tensor.dtype))


def fp8_scale_init(tensor: torch.Tensor, generator: torch.Generator) -> None:
    tensor.fill_(_FP8_SCALE)


def input_scale_init(tensor: torch.Tensor, generator: torch.Generator) -> None:
    """A static FP8 activation scale that keeps activations up to ~22 unclipped."""
    tensor.fill_(0.05)
