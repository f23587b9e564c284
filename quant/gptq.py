"""GPTQ checkpoints (AutoGPTQ / GPTQModel / optimum layout).

```
qweight  int32 [K / P, N]       P = 32 / bits codes per word, packed along K (sequential)
qzeros   int32 [G, N / P]       packed along N (sequential), G = ceil(K / group_size)
scales   fp16  [G, N]
g_idx    int32 [K]              group of each input row (act-order permutes it)
w[k, n] = (q[k, n] - z[g_idx[k], n]) * s[g_idx[k], n]
```
``checkpoint_format: "gptq"`` (v1, the default) stores ``z - 1`` in qzeros, so the
true zero point is ``stored + 1``; ``"gptq_v2"`` stores ``z`` itself. Bits 4 and 8;
group size -1 (one group over K), 32, 64, 128; K need not be a multiple of the group.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tamis.engine.layers.quant_method import LinearMethodBase, QuantizationConfig
from tamis.quant.base import add_param, is_layer_skipped, require, unquantized_method
from tamis.quant.dummy import group_index_init
from tamis.quant.packing import unpack_int32
from tamis.quant.wna16 import apply_wna16, finalize_wna16

SUPPORTED_BITS = (4, 8)
SUPPORTED_GROUP_SIZES = (-1, 32, 64, 128)
CHECKPOINT_FORMATS = ("gptq", "gptq_v2")


class GPTQConfig(QuantizationConfig):
    def __init__(self, bits: int = 4, group_size: int = 128, desc_act: bool = False,
                 sym: bool = True, checkpoint_format: str = "gptq", lm_head: bool = False,
                 modules_to_not_convert: list[str] | None = None):
        if bits not in SUPPORTED_BITS:
            raise ValueError(f"GPTQ checkpoint has bits={bits}; tamis supports {SUPPORTED_BITS}")
        if group_size not in SUPPORTED_GROUP_SIZES:
            raise ValueError(f"GPTQ checkpoint has group_size={group_size}; tamis supports "
                             f"{SUPPORTED_GROUP_SIZES}")
        if checkpoint_format not in CHECKPOINT_FORMATS:
            raise ValueError(f"GPTQ checkpoint has checkpoint_format={checkpoint_format!r}; "
                             f"tamis supports {CHECKPOINT_FORMATS}")
        if lm_head:
            raise ValueError("GPTQ checkpoint quantizes lm_head (lm_head: true); tamis "
                             "supports quantized linear layers inside the decoder only")
        self.bits = bits
        self.group_size = group_size
        self.desc_act = desc_act
        self.sym = sym
        self.checkpoint_format = checkpoint_format
        self.modules_to_not_convert = list(modules_to_not_convert or [])
        self.packed_modules_mapping: dict[str, list[str]] = {}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "GPTQConfig":
        fmt = config.get("checkpoint_format") or config.get("format") or "gptq"
        return cls(bits=config.get("bits", 4), group_size=config.get("group_size", 128),
                   desc_act=bool(config.get("desc_act", False)), sym=bool(config.get("sym", True)),
                   checkpoint_format=fmt, lm_head=bool(config.get("lm_head", False)),
                   modules_to_not_convert=config.get("modules_to_not_convert"))

    @property
    def pack_factor(self) -> int:
        return 32 // self.bits

    def get_name(self) -> str:
        return "gptq"

    def get_linear_method(self, prefix: str) -> LinearMethodBase:
        if is_layer_skipped(prefix, self.modules_to_not_convert, self.packed_modules_mapping):
            return unquantized_method()
        return GPTQLinearMethod(self)


class GPTQLinearMethod(LinearMethodBase):
    def __init__(self, config: GPTQConfig):
        self.config = config

    def _group_size(self, input_size: int) -> int:
        return input_size if self.config.group_size == -1 else self.config.group_size

    def create_weights(self, layer: nn.Module, input_size: int,
                       output_partition_sizes: list[int], params_dtype: torch.dtype) -> None:
        pack = self.config.pack_factor
        require(input_size % pack == 0, layer,
                f"GPTQ {self.config.bits}-bit packs {pack} input rows per int32: "
                f"K={input_size} is not a multiple of {pack}")
        for size in output_partition_sizes:
            require(size % pack == 0, layer, f"GPTQ packs {pack} zero points per int32: "
                    f"shard N={size} is not a multiple of {pack}")
        n = sum(output_partition_sizes)
        group = self._group_size(input_size)
        groups = -(-input_size // group)
        add_param(layer, "qweight", torch.empty(input_size // pack, n, dtype=torch.int32),
                  input_dim=0, output_dim=1, packed_dim=0, packed_factor=pack)
        add_param(layer, "qzeros", torch.empty(groups, n // pack, dtype=torch.int32),
                  input_dim=0, output_dim=1, packed_dim=1, packed_factor=pack,
                  group_dim=0, group_size=group)
        add_param(layer, "scales", torch.empty(groups, n, dtype=torch.float32),
                  input_dim=0, output_dim=1, group_dim=0, group_size=group)
        add_param(layer, "g_idx", torch.empty(input_size, dtype=torch.int32),
                  input_dim=0, ignore_shard=True, group_index=True,
                  dummy_init=group_index_init(group, self.config.desc_act))

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        bits, k = self.config.bits, layer.g_idx.numel()
        n = layer.scales.shape[1]
        codes = unpack_int32(layer.qweight.data, bits, dim=0, length=k)
        zeros = unpack_int32(layer.qzeros.data, bits, dim=1, length=n).to(torch.float32)
        if self.config.checkpoint_format == "gptq":
            zeros = zeros + 1  # v1 stores zero - 1
        finalize_wna16(layer, codes, layer.scales.data, zeros, self._group_size(k), bits,
                       g_idx=layer.g_idx.data)

    def apply(self, layer: nn.Module, x: torch.Tensor,
              bias: torch.Tensor | None = None) -> torch.Tensor:
        return apply_wna16(layer, x, bias)
