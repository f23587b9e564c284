"""AWQ checkpoints, GEMM version (what AutoAWQ writes with ``version: "gemm"``).

```
qweight  int32 [K, N/8]   8 codes per word along N, nibble i = column 8c + AWQ_ORDER[i]
qzeros   int32 [K/G, N/8] same packing
scales   fp16  [K/G, N]
w[k, n] = (q[k, n] - z[k // G, n]) * s[k // G, n]
```
4-bit only; K must be a multiple of the group size (AutoAWQ's own constraint).
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tamis.engine.layers.quant_method import LinearMethodBase, QuantizationConfig
from tamis.quant.base import add_param, is_layer_skipped, require, unquantized_method
from tamis.quant.packing import unpack_awq
from tamis.quant.wna16 import apply_wna16, finalize_wna16

SUPPORTED_GROUP_SIZES = (32, 64, 128)


class AWQConfig(QuantizationConfig):
    def __init__(self, bits: int = 4, group_size: int = 128, zero_point: bool = True,
                 modules_to_not_convert: list[str] | None = None, version: str = "gemm"):
        if bits != 4:
            raise ValueError(f"AWQ checkpoint has bits={bits}; tamis supports 4-bit AWQ")
        if group_size not in SUPPORTED_GROUP_SIZES:
            raise ValueError(f"AWQ checkpoint has group_size={group_size}; tamis supports "
                             f"{SUPPORTED_GROUP_SIZES}")
        if str(version).lower() != "gemm":
            raise ValueError(f"AWQ checkpoint has version={version!r}; tamis supports 'gemm'")
        self.bits = bits
        self.group_size = group_size
        self.zero_point = zero_point
        self.modules_to_not_convert = list(modules_to_not_convert or [])
        self.packed_modules_mapping: dict[str, list[str]] = {}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "AWQConfig":
        return cls(bits=config.get("bits", config.get("w_bit", 4)),
                   group_size=config.get("group_size", config.get("q_group_size", 128)),
                   zero_point=config.get("zero_point", True),
                   modules_to_not_convert=config.get("modules_to_not_convert"),
                   version=config.get("version", "gemm"))

    def get_name(self) -> str:
        return "awq"

    def get_linear_method(self, prefix: str) -> LinearMethodBase:
        if is_layer_skipped(prefix, self.modules_to_not_convert, self.packed_modules_mapping):
            return unquantized_method()
        return AWQLinearMethod(self)


class AWQLinearMethod(LinearMethodBase):
    def __init__(self, config: AWQConfig):
        self.config = config

    def create_weights(self, layer: nn.Module, input_size: int,
                       output_partition_sizes: list[int], params_dtype: torch.dtype) -> None:
        group = self.config.group_size
        require(input_size % group == 0, layer,
                f"AWQ needs K divisible by the group size: K={input_size}, group {group}")
        for size in output_partition_sizes:
            require(size % 8 == 0, layer,
                    f"AWQ packs 8 output columns per int32: shard N={size} is not a multiple of 8")
        n, groups = sum(output_partition_sizes), input_size // group
        packed = dict(input_dim=0, output_dim=1, packed_dim=1, packed_factor=8)
        add_param(layer, "qweight", torch.empty(input_size, n // 8, dtype=torch.int32), **packed)
        add_param(layer, "qzeros", torch.empty(groups, n // 8, dtype=torch.int32),
                  group_dim=0, group_size=group, **packed)
        # float32 holds fp16 / bf16 checkpoint scales exactly whatever the model dtype.
        add_param(layer, "scales", torch.empty(groups, n, dtype=torch.float32),
                  input_dim=0, output_dim=1, group_dim=0, group_size=group)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        codes = unpack_awq(layer.qweight.data)
        zeros = unpack_awq(layer.qzeros.data).to(torch.float32)
        if not self.config.zero_point:
            zeros = torch.full_like(zeros, 8.0)
        finalize_wna16(layer, codes, layer.scales.data.float(), zeros,
                       self.config.group_size, bits=4)

    def apply(self, layer: nn.Module, x: torch.Tensor,
              bias: torch.Tensor | None = None) -> torch.Tensor:
        return apply_wna16(layer, x, bias)
