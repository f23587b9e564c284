"""FP8 (e4m3) weights: serialized checkpoints (``quant_method: fp8``) and online
quantization of a bf16/fp16/fp32 checkpoint (``quantization="fp8"``).

```
weight        float8_e4m3fn [N, K]
weight_scale  float32: a scalar per fused shard (per-tensor) or [N] / [N, 1] (per-channel)
input_scale   float32 scalar per shard, only with activation_scheme "static"
```
Both scale forms load into one per-channel vector of N floats (a shard's per-tensor scale
repeated over its rows), which is exact and what the row-wise scaled matmul takes.
Static input scales of fused shards collapse to their maximum (vLLM does the same).
``ignored_layers`` (vLLM) / ``modules_to_not_convert`` (transformers) stay unquantized.
Online FP8 quantizes each output channel with its own scale as soon as all of a weight's
shards are loaded (``quant/online.py``), so the high-precision model is never whole in
memory.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tamis.engine.layers.quant_method import LinearMethodBase, QuantizationConfig
from tamis.kernels.fp8 import FP8_DTYPE, FP8_MAX, fp8_linear, fp8_supported, quantize_fp8
from tamis.quant.base import (add_param, is_layer_skipped, replace_param, require,
                              shard_index_of, shard_slice, unquantized_method)
from tamis.quant.dummy import fp8_scale_init, fp8_weight_init, input_scale_init
from tamis.quant.online import StagedWeight, placeholder

ACTIVATION_SCHEMES = ("static", "dynamic")


class Fp8Config(QuantizationConfig):
    def __init__(self, is_checkpoint_fp8_serialized: bool = False,
                 activation_scheme: str = "dynamic", ignored_layers: list[str] | None = None,
                 weight_block_size: list[int] | None = None):
        if activation_scheme not in ACTIVATION_SCHEMES:
            raise ValueError(f"FP8 checkpoint has activation_scheme={activation_scheme!r}; "
                             f"tamis supports {ACTIVATION_SCHEMES}")
        if weight_block_size is not None:
            raise ValueError(f"FP8 checkpoint has block-wise scales (weight_block_size="
                             f"{weight_block_size}); tamis supports per-tensor and per-channel")
        if activation_scheme == "static" and not is_checkpoint_fp8_serialized:
            raise ValueError("online FP8 quantization supports activation_scheme 'dynamic' only")
        self.is_checkpoint_fp8_serialized = is_checkpoint_fp8_serialized
        self.activation_scheme = activation_scheme
        self.ignored_layers = list(ignored_layers or [])
        self.packed_modules_mapping: dict[str, list[str]] = {}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "Fp8Config":
        ignored = ignored_layers_of(config)
        return cls(is_checkpoint_fp8_serialized=True,
                   activation_scheme=config.get("activation_scheme", "dynamic"),
                   ignored_layers=ignored, weight_block_size=config.get("weight_block_size"))

    def get_name(self) -> str:
        return "fp8"

    def get_linear_method(self, prefix: str) -> LinearMethodBase:
        if is_layer_skipped(prefix, self.ignored_layers, self.packed_modules_mapping):
            return unquantized_method()
        if not self.is_checkpoint_fp8_serialized:
            return OnlineFp8LinearMethod()
        return Fp8LinearMethod(static=self.activation_scheme == "static")


def per_channel_scale_loader(layer: nn.Module):
    """Loads a shard's weight_scale, scalar or per-channel, into the [N] vector."""
    def load(param: torch.Tensor, loaded: torch.Tensor, shard_id=None) -> None:
        offset, size = shard_slice(layer, shard_id)
        target = param.data.narrow(0, offset, size)
        if loaded.numel() == 1:
            target.fill_(loaded.float().reshape(()).item())
        elif loaded.numel() == size:
            target.copy_(loaded.float().reshape(size))
        else:
            raise ValueError(f"{layer.prefix}: weight_scale has shape {tuple(loaded.shape)}; "
                             f"expected a scalar (per-tensor) or {size} values (per-channel)")
    return load


def _per_shard_scalar_loader(layer: nn.Module, name: str):
    def load(param: torch.Tensor, loaded: torch.Tensor, shard_id=None) -> None:
        if loaded.numel() != 1:
            raise ValueError(f"{layer.prefix}: {name} has shape {tuple(loaded.shape)}; "
                             f"tamis supports a per-tensor (scalar) {name}")
        param.data[shard_index_of(layer, shard_id)] = loaded.float().reshape(())
    return load


def check_fp8_device(layer: nn.Module, device: torch.device) -> None:
    """FP8 weights on a GPU without FP8 tensor cores run as W8A16 (upcast per call);
    anything but CPU / CUDA is refused by name."""
    require(device.type in ("cpu", "cuda"), layer,
            f"FP8 weights are supported on CPU and CUDA devices, not {device.type!r}")
    layer.fp8_w8a8 = fp8_supported(device)


class Fp8LinearMethod(LinearMethodBase):
    def __init__(self, static: bool):
        self.static = static

    def create_weights(self, layer: nn.Module, input_size: int,
                       output_partition_sizes: list[int], params_dtype: torch.dtype) -> None:
        n = sum(output_partition_sizes)
        add_param(layer, "weight", torch.empty(n, input_size, dtype=FP8_DTYPE),
                  input_dim=1, output_dim=0, dummy_init=fp8_weight_init)
        add_param(layer, "weight_scale", torch.full((n,), float("nan"), dtype=torch.float32),
                  output_dim=0, weight_loader=per_channel_scale_loader(layer),
                  dummy_init=fp8_scale_init)
        if self.static:
            add_param(layer, "input_scale",
                      torch.full((len(output_partition_sizes),), float("nan")),
                      is_per_shard_scalar=True, dummy_init=input_scale_init,
                      weight_loader=_per_shard_scalar_loader(layer, "input_scale"))

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        require(not torch.isnan(layer.weight_scale).any(), layer, "weight_scale was not loaded")
        if self.static:
            require(not torch.isnan(layer.input_scale).any(), layer,
                    "activation_scheme is 'static' but input_scale was not loaded")
            replace_param(layer, "input_scale", layer.input_scale.data.max().reshape(()))
        check_fp8_device(layer, layer.weight.device)

    def apply(self, layer: nn.Module, x: torch.Tensor,
              bias: torch.Tensor | None = None) -> torch.Tensor:
        if not x.is_cuda:
            # CPU reference: dequantize once, then plain matmuls (W8A16).
            dense = getattr(layer, "fp8_dense", None)
            if dense is None or dense.dtype != x.dtype:
                dense = (layer.weight.float() * layer.weight_scale[:, None]).to(x.dtype)
                layer.fp8_dense = dense
            return F.linear(x, dense, bias)
        input_scale = layer.input_scale if self.static else None
        return fp8_linear(x, layer.weight, layer.weight_scale, input_scale, bias)


class OnlineFp8LinearMethod(Fp8LinearMethod):
    """Quantizes the checkpoint's high-precision weight per channel as soon as all of its
    shards are loaded; the layer holds it in high precision only until then."""

    def __init__(self):
        super().__init__(static=False)

    def create_weights(self, layer: nn.Module, input_size: int,
                       output_partition_sizes: list[int], params_dtype: torch.dtype) -> None:
        staged = StagedWeight(layer.weight_loader, quantize_weight_per_channel)
        add_param(layer, "weight", placeholder((sum(output_partition_sizes), input_size),
                                               params_dtype),
                  input_dim=1, output_dim=0, **staged.attrs())

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        weight, scale = layer.weight.staged.take_quantized(layer)
        replace_param(layer, "weight", weight)
        replace_param(layer, "weight_scale", scale)
        check_fp8_device(layer, weight.device)


def quantize_weight_per_channel(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, K] -> (float8 [N, K], float32 [N]) with each row's amax mapped to 448."""
    # abs and max are exact in any float dtype: no float32 copy of the weight for them.
    scale = weight.abs().amax(dim=1).float() / FP8_MAX
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    return quantize_fp8(weight, scale.reshape(-1, 1)), scale


def ignored_layers_of(config: dict[str, Any]) -> list[str]:
    """The layers a quantization_config leaves unquantized, under either of its names."""
    return list(config.get("ignored_layers") or []) + list(
        config.get("modules_to_not_convert") or [])
