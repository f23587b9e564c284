"""Helpers every quantization method shares: parameters, skipped layers, shard offsets."""
from __future__ import annotations

import re
from typing import Any, Iterable

import torch
from torch import nn

from tamis.engine.layers.quant_method import LinearMethodBase, set_weight_attrs

# vLLM's fused names; a model overrides them through ``packed_modules_mapping``.
DEFAULT_PACKED_MODULES = {"qkv_proj": ["q_proj", "k_proj", "v_proj"],
                          "gate_up_proj": ["gate_proj", "up_proj"]}


def add_param(layer: nn.Module, name: str, tensor: torch.Tensor, **attrs: Any) -> nn.Parameter:
    """Registers ``tensor`` on ``layer`` as a frozen parameter carrying loader attributes."""
    param = nn.Parameter(tensor, requires_grad=False)
    set_weight_attrs(param, attrs)
    layer.register_parameter(name, param)
    return param


def replace_param(layer: nn.Module, name: str, tensor: torch.Tensor) -> None:
    """Swaps a loaded parameter for its repacked form (frees the checkpoint layout)."""
    if hasattr(layer, name):
        delattr(layer, name)
    layer.register_parameter(name, nn.Parameter(tensor, requires_grad=False))


def layer_name(layer: nn.Module) -> str:
    return getattr(layer, "prefix", "") or type(layer).__name__


def shard_slice(layer: nn.Module, shard_id) -> tuple[int, int]:
    """(offset, size) along N of a fused layer's shard (whole layer for ``None``)."""
    sizes = layer.output_partition_sizes
    if shard_id is None:
        return 0, sum(sizes)
    index = layer.shard_index(shard_id)
    return sum(sizes[:index]), sizes[index]


def shard_index_of(layer: nn.Module, shard_id) -> int:
    return 0 if shard_id is None else layer.shard_index(shard_id)


def unfused_names(prefix: str, packed_modules: dict[str, list[str]] | None) -> list[str]:
    """"a.qkv_proj" -> ["a.q_proj", "a.k_proj", "a.v_proj"]; other prefixes unchanged."""
    mapping = packed_modules or DEFAULT_PACKED_MODULES
    head, _, last = prefix.rpartition(".")
    if last not in mapping:
        return [prefix]
    return [f"{head}.{shard}" if head else shard for shard in mapping[last]]


def matches(name: str, patterns: Iterable[str]) -> bool:
    """vLLM / compressed-tensors ignore-list matching: exact name, a ``re:`` regex, or a
    suffix of whole components ("lm_head", "mlp.down_proj")."""
    for pattern in patterns:
        if pattern.startswith("re:"):
            if re.match(pattern[3:], name):
                return True
        elif name == pattern or name.endswith("." + pattern):
            return True
    return False


def is_layer_skipped(prefix: str, ignored: Iterable[str],
                     packed_modules: dict[str, list[str]] | None) -> bool:
    """True if the layer is not quantized; a fused layer must be skipped for all shards
    or none (a checkpoint that quantizes q but not k cannot be fused)."""
    ignored = list(ignored)
    shards = unfused_names(prefix, packed_modules)
    skipped = [matches(shard, ignored) for shard in shards]
    if any(skipped) and not all(skipped):
        raise ValueError(f"{prefix}: the checkpoint quantizes only some of the fused shards "
                         f"{shards}; tamis needs all or none of them ignored")
    return all(skipped)


def unquantized_method() -> LinearMethodBase:
    from tamis.engine.layers.linear import UnquantizedLinearMethod
    return UnquantizedLinearMethod()


def require(condition: bool, layer: nn.Module | str, message: str) -> None:
    """Raises ValueError naming the layer when ``condition`` is false."""
    if not condition:
        name = layer if isinstance(layer, str) else layer_name(layer)
        raise ValueError(f"{name}: {message}")

