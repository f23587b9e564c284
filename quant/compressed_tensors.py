"""compressed-tensors checkpoints (what llm-compressor writes): W4A16 / W8A16
``pack-quantized``, INT8 W8A8 ``int-quantized`` (``quant/int8.py``) and FP8 W8A8
``float-quantized``.

```
pack-quantized (int weights, per-channel or per-group scales)
  weight_packed      int32 [N, ceil(K*b/32)]  codes + 2**(b-1) packed along K (sequential)
  weight_scale       [N, G]                  G = ceil(K / group_size), 1 for "channel"
  weight_zero_point  int32 [ceil(N*b/32), G] asymmetric only, packed along N, offset likewise
  weight_shape       int64 [2]               (N, K) of the shard
  weight_g_idx       int32 [K]               act-order "group" only
  w = (q - zp) * s, q and zp signed
float-quantized (FP8 W8A8)
  weight [N, K] float8_e4m3fn; weight_scale [N, 1] ("channel") or [1] ("tensor");
  input_scale [1] when activations are static, none when "dynamic" (per token)
```
The quantization_config's ``config_groups`` say which layers get which scheme
(``targets``: "Linear" or layer names / ``re:`` patterns); ``ignore`` lists layers kept
in full precision.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from tamis.engine.layers.quant_method import LinearMethodBase, QuantizationConfig
from tamis.quant.base import (add_param, is_layer_skipped, matches, require, shard_index_of,
                              unfused_names, unquantized_method)
from tamis.quant.dummy import group_index_init, values_init
from tamis.quant.fp8 import Fp8LinearMethod
from tamis.quant.int8 import parse_int8_w8a8
from tamis.quant.packing import unpack_int32
from tamis.quant.wna16 import apply_wna16, finalize_wna16

SUPPORTED = ("W4A16 / W8A16 int weights (pack-quantized), INT8 W8A8 (int-quantized) and "
             "FP8 W8A8 (float-quantized)")
WNA16_BITS = (4, 8)
WNA16_GROUP_SIZES = (32, 64, 128)   # as GPTQ; strategy "channel" is GPTQ's group size -1
ACT_ORDERS = (None, "group", "dynamic", "weight", "static")


class CompressedTensorsConfig(QuantizationConfig):
    def __init__(self, config_groups: dict[str, dict], ignore: list[str] | None = None,
                 fmt: str | None = None):
        if not config_groups:
            raise ValueError("compressed-tensors checkpoint has no config_groups")
        self.schemes = [_parse_scheme(name, group, fmt) for name, group in config_groups.items()]
        self.ignore = list(ignore or [])
        self.packed_modules_mapping: dict[str, list[str]] = {}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "CompressedTensorsConfig":
        status = config.get("quantization_status", "compressed")
        if status not in ("compressed", "frozen"):
            raise ValueError(f"compressed-tensors checkpoint has quantization_status="
                             f"{status!r}; tamis loads saved ('compressed') checkpoints")
        return cls(config.get("config_groups") or {}, config.get("ignore"), config.get("format"))

    def get_name(self) -> str:
        return "compressed-tensors"

    def get_linear_method(self, prefix: str) -> LinearMethodBase:
        if is_layer_skipped(prefix, self.ignore, self.packed_modules_mapping):
            return unquantized_method()
        shards = unfused_names(prefix, self.packed_modules_mapping)
        for scheme in self.schemes:
            hits = [_targets(scheme["targets"], shard) for shard in shards]
            if all(hits):
                return scheme["method"]()
            if any(hits):
                raise ValueError(f"{prefix}: config group {scheme['name']!r} targets only some "
                                 f"of the fused shards {shards}")
        return unquantized_method()


def _targets(targets: list[str], name: str) -> bool:
    return "Linear" in targets or matches(name, targets)


def _parse_scheme(name: str, group: dict[str, Any], fmt: str | None) -> dict[str, Any]:
    """One config group -> {name, targets, method factory}. Every setting tamis does not
    run is a ValueError naming the group and the setting (type, format, num_bits,
    strategy, group_size, ...), raised here, before any tensor is read."""
    weights = group.get("weights") or {}
    acts = group.get("input_activations")
    fmt = group.get("format") or fmt
    kind = weights.get("type", "int")

    def unsupported(what: str) -> ValueError:
        return ValueError(f"compressed-tensors config group {name!r} has {what}; "
                          f"tamis supports {SUPPORTED}")

    if not weights:
        raise unsupported("no weights scheme")
    if group.get("output_activations") is not None:
        raise unsupported("quantized output activations")
    if weights.get("dynamic", False) is not False:
        raise unsupported(f"weights dynamic={weights.get('dynamic')!r}")
    if kind == "int" and fmt == "int-quantized":
        method = parse_int8_w8a8(weights, acts, unsupported)
    elif kind == "int":
        method = _parse_wna16(weights, acts, fmt, unsupported)
    elif kind == "float":
        method = _parse_fp8(weights, acts, fmt, unsupported)
    else:
        raise unsupported(f"weight type {kind!r}")
    return {"name": name, "targets": list(group.get("targets") or []), "method": method}


def _parse_wna16(weights: dict[str, Any], acts: dict[str, Any] | None, fmt: str | None,
                 unsupported) -> Callable[[], LinearMethodBase]:
    bits, strategy = weights.get("num_bits"), weights.get("strategy")
    if fmt != "pack-quantized":
        raise unsupported(f"format {fmt!r} for int weights")
    if acts is not None:
        raise unsupported("quantized int activations")
    if bits not in WNA16_BITS:
        raise unsupported(f"num_bits={bits!r} (pack-quantized: {WNA16_BITS})")
    if strategy not in ("group", "channel"):
        raise unsupported(f"weight strategy {strategy!r} (pack-quantized: 'group', 'channel')")
    group_size = weights.get("group_size") if strategy == "group" else None
    if strategy == "group" and group_size not in WNA16_GROUP_SIZES:
        raise unsupported(f"group_size={group_size!r} (strategy 'group': "
                          f"{WNA16_GROUP_SIZES}; 'channel' for one group per row)")
    actorder = weights.get("actorder")
    if actorder not in ACT_ORDERS:
        raise unsupported(f"actorder={actorder!r} (one of {ACT_ORDERS})")
    sym = bool(weights.get("symmetric", True))
    # "group" (alias "dynamic") stores weight_g_idx; "weight" ("static") keeps the
    # groups contiguous, so the checkpoint reads as a plain one.
    act_order = strategy == "group" and actorder in ("group", "dynamic")
    return lambda: CTWNA16LinearMethod(bits, group_size, sym, act_order)


def _parse_fp8(weights: dict[str, Any], acts: dict[str, Any] | None, fmt: str | None,
               unsupported) -> Callable[[], LinearMethodBase]:
    bits, strategy = weights.get("num_bits"), weights.get("strategy")
    if fmt not in (None, "float-quantized"):
        raise unsupported(f"format {fmt!r} for float weights")
    if bits != 8:
        raise unsupported(f"float weights num_bits={bits!r} (FP8: 8)")
    if strategy not in ("tensor", "channel"):
        raise unsupported(f"float weights strategy={strategy!r} (FP8: 'tensor', 'channel')")
    if not weights.get("symmetric", True):
        raise unsupported("asymmetric float weights")
    static = False
    if acts is not None:
        if acts.get("type") != "float" or acts.get("num_bits") != 8:
            raise unsupported("non-FP8 input activations with FP8 weights")
        static = not acts.get("dynamic", False)
        if static and acts.get("strategy") != "tensor":
            raise unsupported(f"static activation strategy {acts.get('strategy')!r}")
        if not static and acts.get("strategy") not in ("token", "tensor"):
            # Dynamic per-tensor scales are computed per token: each row's own scale.
            raise unsupported(f"dynamic activation strategy {acts.get('strategy')!r}")
    return lambda: Fp8LinearMethod(static=static)


class CTWNA16LinearMethod(LinearMethodBase):
    def __init__(self, bits: int, group_size: int | None, sym: bool, act_order: bool):
        self.bits = bits
        self.group_size = group_size
        self.sym = sym
        self.act_order = act_order

    def create_weights(self, layer: nn.Module, input_size: int,
                       output_partition_sizes: list[int], params_dtype: torch.dtype) -> None:
        pack = 32 // self.bits
        n = sum(output_partition_sizes)
        group = self.group_size or input_size
        groups = -(-input_size // group)
        add_param(layer, "weight_packed", torch.empty(n, -(-input_size // pack), dtype=torch.int32),
                  input_dim=1, output_dim=0, packed_dim=1, packed_factor=pack)
        add_param(layer, "weight_scale", torch.empty(n, groups, dtype=torch.float32),
                  input_dim=1, output_dim=0, group_dim=1, group_size=group)
        shapes = [[size, input_size] for size in output_partition_sizes]
        add_param(layer, "weight_shape",
                  torch.zeros(len(output_partition_sizes), 2, dtype=torch.int64),
                  weight_loader=_weight_shape_loader(layer), dummy_init=values_init(shapes),
                  holds_shape=True)
        if not self.sym:
            for size in output_partition_sizes:
                require(size % pack == 0, layer, f"packed zero points need shard N={size} to be "
                        f"a multiple of {pack}")
            add_param(layer, "weight_zero_point", torch.empty(n // pack, groups, dtype=torch.int32),
                      input_dim=1, output_dim=0, packed_dim=0, packed_factor=pack,
                      group_dim=1, group_size=group)
        if self.act_order:
            add_param(layer, "weight_g_idx", torch.empty(input_size, dtype=torch.int32),
                      input_dim=0, ignore_shard=True, group_index=True,
                      dummy_init=group_index_init(group, act_order=True))

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        n, k = layer.output_size, layer.input_size
        expected = torch.tensor([[size, k] for size in layer.output_partition_sizes])
        require(torch.equal(layer.weight_shape.data.cpu(), expected), layer,
                f"weight_shape says {layer.weight_shape.tolist()}, the layer is {expected.tolist()}")
        offset = 1 << (self.bits - 1)
        codes = unpack_int32(layer.weight_packed.data, self.bits, dim=1, length=k).t()
        scales = layer.weight_scale.data.t()
        if self.sym:
            zeros = torch.full_like(scales, float(offset))
        else:
            zeros = unpack_int32(layer.weight_zero_point.data, self.bits, dim=0, length=n).t()
        g_idx = layer.weight_g_idx.data if self.act_order else None
        finalize_wna16(layer, codes, scales, zeros.float(), self.group_size or k, self.bits,
                       g_idx=g_idx)

    def apply(self, layer: nn.Module, x: torch.Tensor,
              bias: torch.Tensor | None = None) -> torch.Tensor:
        return apply_wna16(layer, x, bias)


def _weight_shape_loader(layer: nn.Module):
    """weight_shape differs per fused shard, so each lands in its own row."""
    def load(param: torch.Tensor, loaded: torch.Tensor, shard_id=None) -> None:
        if loaded.numel() != 2:
            raise ValueError(f"{layer.prefix}: weight_shape has {loaded.numel()} values, expected 2")
        param.data[shard_index_of(layer, shard_id)] = loaded.reshape(2).to(torch.int64)
    return load
