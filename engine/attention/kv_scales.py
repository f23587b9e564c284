"""FP8 KV-cache scales: read from a checkpoint as vLLM reads them, or measured.

Checkpoints quantized for an FP8 KV cache carry one scale per attention layer for keys
and one for values, under one of these names (``L`` = ``model.layers.N.self_attn``)::

    L.k_scale, L.v_scale                       vLLM / llm-compressor ``kv_cache_scheme``
    L.attn.k_scale, L.attn.v_scale             the same, vLLM's module path
    L.kv_scale                                 older AutoFP8: one scale for both
    L.k_proj.output_scale, L.v_proj.output_scale   older compressed-tensors ``kv_cache_scheme``

``KVScaleCollector`` takes them out of the stream of checkpoint tensors (the model has no
parameter for them) and ``apply`` sets them on each layer's ``Attention``. A layer the
checkpoint gives no scale keeps 1.0 (vLLM's default), or with ``--calculate-kv-scales``
(``calculate_on_first_prefill``) gets scales measured on the first batch it stores:
``amax(|k|) / K_SCALE_RANGE`` and ``amax(|v|) / V_SCALE_RANGE``, then fixed for the life of
the engine (later keys past ``448 * k_scale`` saturate, as in vLLM). Such a layer also
stores its keys and values rotated and less that batch's mean key and mean value, and
measures its scales on what it stores (``tamis.engine.layers.attention``). The scales only
matter to an FP8 cache (``--kv-cache-dtype fp8``); other caches ignore them.
"""
from __future__ import annotations

import logging
import math
import re
from typing import Iterable, Iterator

import torch
from torch import nn

from tamis.engine.attention.kv_rotation import random_hadamard

logger = logging.getLogger(__name__)

FP8_KV_CACHE_DTYPES = ("fp8", "fp8_e4m3")

_SCALE_NAME = re.compile(
    r"(?P<layer>.+\.self_attn)\.(?:(?:attn\.)?(?P<which>k_scale|v_scale|kv_scale)"
    r"|(?P<proj>k_proj|v_proj)\.output_scale)")
# vLLM's K_SCALE_CONSTANT / V_SCALE_CONSTANT: the first batch's amax lands on 200 (keys)
# and 100 (values) of e4m3's 448, leaving 2.2x / 4.5x of headroom for later batches.
K_SCALE_RANGE = 200.0
V_SCALE_RANGE = 100.0

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
            attention.kv_scales_from_checkpoint = True


def calculate_on_first_prefill(model: nn.Module, kv_cache_dtype: str) -> int:
    """``--calculate-kv-scales``: marks every attention layer without checkpoint scales to
    measure its scales on the first batch that stores tokens (``Attention.forward`` calls
    ``measure_scales``) and gives it the rotation its cache is stored in
    (``kv_rotation.random_hadamard``; none where head_dim is not a power of two). Call it
    before any token is stored. Returns how many layers were marked.

    Only an FP8 cache has scales: with another ``kv_cache_dtype`` nothing is marked and a
    warning says the flag does nothing (vLLM accepts the flag with any cache dtype too, so
    one command line serves both).
    """
    from tamis.engine.layers.attention import Attention

    if kv_cache_dtype not in FP8_KV_CACHE_DTYPES:
        logger.warning("--calculate-kv-scales has no effect with --kv-cache-dtype %s: only an "
                       "fp8 cache is scaled", kv_cache_dtype)
        return 0

    layers = [m for m in model.modules() if isinstance(m, Attention)
              and not m.kv_scales_from_checkpoint]
    if not layers:
        return 0
    first = next(model.parameters())
    dtype = getattr(model, "dtype", None) or first.dtype
    rotations = {dim: random_hadamard(dim, first.device, dtype)
                 for dim in {attention.head_dim for attention in layers}}
    for attention in layers:
        attention.calculate_kv_scales = True
        attention.kv_rotation = rotations[attention.head_dim]
    return len(layers)


def scales_pending(model: nn.Module) -> bool:
    """Whether some attention layer still waits for a batch to measure its scales."""
    return any(getattr(m, "calculate_kv_scales", False) for m in model.modules())


def stored_rows(slot_mapping: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[T, 1, 1]: 1 for tokens the pass stores, 0 for padding (slot -1)."""
    return (slot_mapping >= 0).to(dtype)[:, None, None]


def mean_over_stored(x: torch.Tensor, slot_mapping: torch.Tensor) -> torch.Tensor:
    """[Hkv, D]: the mean over the stored tokens of x [T, Hkv, D] (keys or values), per head
    and channel."""
    stored = stored_rows(slot_mapping, x.dtype)
    return (x * stored).sum(0) / stored.sum().clamp(min=1)


def measure_scales(k: torch.Tensor, v: torch.Tensor,
                   slot_mapping: torch.Tensor) -> tuple[float, float]:
    """(k_scale, v_scale) from the stored tokens of k/v [T, Hkv, D] (slot -1, padding, is
    left out): ``amax / K_SCALE_RANGE`` and ``amax / V_SCALE_RANGE``; an all-zero tensor
    gives 1.0. One device sync."""
    stored = stored_rows(slot_mapping, k.dtype)
    amax = torch.stack([(k * stored).abs().amax(), (v * stored).abs().amax()]).float().tolist()
    return tuple(a / r if a > 0 and math.isfinite(a) else 1.0
                 for a, r in zip(amax, (K_SCALE_RANGE, V_SCALE_RANGE)))
