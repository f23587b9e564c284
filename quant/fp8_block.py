"""Block-wise FP8 checkpoints as DeepSeek-V3 and Qwen3-FP8 publish them
(``quant_method: fp8`` with ``weight_block_size``).

```
weight            float8_e4m3fn [N, K]
weight_scale_inv  float32 [ceil(N/128), ceil(K/128)]   w = weight * scale_inv per 128x128 block
activation_scheme "dynamic": activations quantized per token and group of 128 at run time
```
A fused layer (qkv, gate_up) stacks its shards' block rows, so each shard's N must be a
multiple of the block's 128 rows (every published model's are); a single layer may end in
a partial block along N or K, as the format allows.

On an FP8 GPU the matmul runs W8A8 (``kernels/fp8_block.py``). Elsewhere the weight is
dequantized block by block and the matmul runs in the model dtype, which is exactly what
transformers does with these checkpoints on a CPU.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tamis.engine.layers.quant_method import LinearMethodBase, QuantizationConfig
from tamis.kernels.fp8 import FP8_DTYPE
from tamis.kernels.fp8_block import block_fp8_linear, dequantize_block_fp8
from tamis.quant.base import (add_param, is_layer_skipped, require, shard_index_of,
                              unquantized_method)
from tamis.quant.dummy import fp8_scale_init, fp8_weight_init
from tamis.quant.fp8 import check_fp8_device, ignored_layers_of

SUPPORTED_BLOCK = [128, 128]


class Fp8BlockConfig(QuantizationConfig):
    def __init__(self, weight_block_size: list[int], activation_scheme: str = "dynamic",
                 ignored_layers: list[str] | None = None):
        if list(weight_block_size) != SUPPORTED_BLOCK:
            raise ValueError(f"FP8 checkpoint has weight_block_size={weight_block_size}; tamis "
                             f"supports block-wise FP8 with {SUPPORTED_BLOCK} blocks")
        if activation_scheme != "dynamic":
            raise ValueError(f"block-wise FP8 checkpoint has activation_scheme="
                             f"{activation_scheme!r}; tamis supports 'dynamic' with "
                             f"weight_block_size")
        self.block = (weight_block_size[0], weight_block_size[1])
        self.ignored_layers = list(ignored_layers or [])
        self.packed_modules_mapping: dict[str, list[str]] = {}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "Fp8BlockConfig":
        ignored = ignored_layers_of(config)
        return cls(config["weight_block_size"], config.get("activation_scheme", "dynamic"),
                   ignored)

    def get_name(self) -> str:
        return "fp8"

    def get_linear_method(self, prefix: str) -> LinearMethodBase:
        if is_layer_skipped(prefix, self.ignored_layers, self.packed_modules_mapping):
            return unquantized_method()
        return Fp8BlockLinearMethod(self.block)


def _block_rows_loader(layer: nn.Module, block_n: int):
    """Loads a shard's scale_inv rows at the shard's block offset along N."""
    def load(param: torch.Tensor, loaded: torch.Tensor, shard_id=None) -> None:
        index = shard_index_of(layer, shard_id)
        sizes = layer.output_partition_sizes if shard_id is not None else [layer.output_size]
        offset = sum(sizes[:index]) // block_n
        rows = -(-sizes[index] // block_n)
        target = param.data.narrow(0, offset, rows)
        if loaded.shape != target.shape:
            raise ValueError(f"{layer.prefix}: weight_scale_inv has shape {tuple(loaded.shape)}, "
                             f"expected {tuple(target.shape)} (one scale per {block_n}x"
                             f"{block_n} block)")
        target.copy_(loaded.float())
    return load


class Fp8BlockLinearMethod(LinearMethodBase):
    def __init__(self, block: tuple[int, int]):
        self.block = block

    def create_weights(self, layer: nn.Module, input_size: int,
                       output_partition_sizes: list[int], params_dtype: torch.dtype) -> None:
        block_n, block_k = self.block
        if len(output_partition_sizes) > 1:
            for size in output_partition_sizes:
                require(size % block_n == 0, layer, f"a fused shard of N={size} rows is not a "
                        f"multiple of the FP8 block's {block_n} rows, so its weight_scale_inv "
                        f"rows cannot be stacked")
        n = sum(output_partition_sizes)
        add_param(layer, "weight", torch.empty(n, input_size, dtype=FP8_DTYPE),
                  input_dim=1, output_dim=0, dummy_init=fp8_weight_init)
        add_param(layer, "weight_scale_inv",
                  torch.full((-(-n // block_n), -(-input_size // block_k)), float("nan")),
                  weight_loader=_block_rows_loader(layer, block_n),
                  dummy_init=fp8_scale_init)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        require(not torch.isnan(layer.weight_scale_inv).any(), layer,
                "weight_scale_inv was not loaded")
        check_fp8_device(layer, layer.weight.device)

    def apply(self, layer: nn.Module, x: torch.Tensor,
              bias: torch.Tensor | None = None) -> torch.Tensor:
        dense = None
        if not x.is_cuda:
            # CPU: dequantize once and keep it (GPUs without FP8 dequantize per call
            # rather than hold a second, dense copy of every weight).
            dense = getattr(layer, "fp8_dense", None)
            if dense is None or dense.dtype != x.dtype:
                dense = dequantize_block_fp8(layer.weight, layer.weight_scale_inv, self.block,
                                             x.dtype)
                layer.fp8_dense = dense
        return block_fp8_linear(x, layer.weight, layer.weight_scale_inv, self.block, bias,
                                dense=dense)

