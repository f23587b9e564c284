"""FP8 KV-cache scales read from a checkpoint, as vLLM reads them.

Checkpoints quantized for an FP8 KV cache carry one scale per attention layer for keys
and one for values, under one of these names (``L`` = ``model.layers.N.self_attn``)::

    L.k_scale, L.v_scale                       vLLM / llm-compressor ``kv_cache_scheme``
    L.attn.k_scale, L.attn.v_scale             the same, vLLM's module path
    L.kv_scale                                 older AutoFP8: one scale for both
    L.k_proj.output_scale, L.v_proj.output_scale   older compressed-tensors ``kv_cache_scheme``

``KVScaleCollector`` takes them out of the stream of checkpoint tensors (the model has no
parameter for them) and ``apply`` sets them on each layer's ``Attention``. A layer the
checkpoint gives no scale keeps 1.0 (vLLM's default). The scales only matter to an FP8
cache (``--kv-cache-dtype fp8``); other caches ignore them.
"""
from __future__ import annotations

import re
from typing import Iterable, Iterator

import torch
from torch import nn

_SCALE_NAME = re.compile(
    r"(?P<layer>.+\.self_attn)\.(?:(?:attn\.)?(?P<which>k_scale|v_scale|kv_scale)"
    r"|(?P<proj>k_proj|v_proj)\.output_scale)")
_TARGETS = {"k_scale": ("k_scale",), "v_scale": ("v_scale",), "kv_scale": ("k_scale", "v_scale"),
            "k_proj": ("k_scale",), "v_proj": ("v_scale",)}


def scale_value(name: str, tensor: torch.Tensor) -> float:
    """The one float a per-tensor scale holds; ValueError naming the tensor otherwise."""
    if tensor.numel() != 1:
        raise ValueError(f"KV-cache scale {name!r} must hold one value (per-tensor), "
                         f"got shape {tuple(tensor.shape)}")
    value = float(tensor.float().item())
    if not value > 0 or value == float("inf"):
        raise ValueError(f"KV-cache scale {name!r} must be a positive finite number, got {value}")
    return value


class KVScaleCollector:
    """Filters a checkpoint stream: KV-cache scales are kept here, the rest passes on."""

    def __init__(self) -> None:
        self.scales: dict[str, dict[str, float]] = {}   # "...self_attn" -> {"k_scale": s, ...}
        self.names: set[str] = set()

    def filter(self, weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in weights:
            match = _SCALE_NAME.fullmatch(name)
            if match is None:
                yield name, tensor
                continue
            value = scale_value(name, tensor)
            for target in _TARGETS[match["which"] or match["proj"]]:
                self.scales.setdefault(match["layer"], {})[target] = value
            self.names.add(name)

    def apply(self, model: nn.Module) -> None:
        """Sets ``k_scale`` / ``v_scale`` on ``<layer>.attn`` for every layer collected."""
        for layer, scales in self.scales.items():
            try:
                attention = model.get_submodule(f"{layer}.attn")
            except AttributeError:
                raise ValueError(f"unexpected KV-cache scale for {layer!r} in the checkpoint: "
                                 f"the model has no attention layer there") from None
            for target, value in scales.items():
                setattr(attention, target, value)
