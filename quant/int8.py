"""compressed-tensors INT8 W8A8 (``format: int-quantized``, llm-compressor's W8A8 preset).

```
weight        int8 [N, K], symmetric per output channel
weight_scale  float [N, 1]                 w = weight * weight_scale
activations   int8, dynamic, symmetric, one scale per token (computed at run time)
```
``parse_int8_w8a8`` validates a config group's weights and input activations and names
what it refuses (asymmetric, static, per-group or non-8-bit variants).
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from tamis.engine.layers.quant_method import LinearMethodBase
from tamis.kernels.int8 import int8_linear
from tamis.quant.base import add_param, require
from tamis.quant.fp8 import per_channel_scale_loader

SUPPORTED = ("INT8 W8A8 with symmetric per-channel int8 weights and dynamic symmetric "
             "per-token int8 activations")


def parse_int8_w8a8(weights: dict[str, Any], acts: dict[str, Any] | None,
                    unsupported: Callable[[str], ValueError]) -> Callable[[], LinearMethodBase]:
    """The method factory for an ``int-quantized`` group; ``unsupported(what)`` builds the
    error for a variant tamis does not run."""
    def refuse(what: str) -> ValueError:
        return unsupported(f"{what} ({SUPPORTED} is supported for int-quantized)")

    if weights.get("num_bits") != 8 or weights.get("strategy") != "channel":
        raise refuse(f"int weights num_bits={weights.get('num_bits')} "
                     f"strategy={weights.get('strategy')!r}")
    if not weights.get("symmetric", True):
        raise refuse("asymmetric int8 weights")
    if acts is None:
        raise refuse("int8 weights without quantized input activations")
    if acts.get("type", "int") != "int" or acts.get("num_bits") != 8:
        raise refuse(f"{acts.get('type')} input activations of {acts.get('num_bits')} bits")
    if not acts.get("dynamic", False):
        raise refuse("static int8 input activation scales")
    if acts.get("strategy") != "token":
        raise refuse(f"input activation strategy {acts.get('strategy')!r}")
    if not acts.get("symmetric", True):
        raise refuse("asymmetric int8 input activations")
    return Int8W8A8LinearMethod


class Int8W8A8LinearMethod(LinearMethodBase):
    def create_weights(self, layer: nn.Module, input_size: int,
                       output_partition_sizes: list[int], params_dtype: torch.dtype) -> None:
        n = sum(output_partition_sizes)
        add_param(layer, "weight", torch.empty(n, input_size, dtype=torch.int8),
                  input_dim=1, output_dim=0)
        add_param(layer, "weight_scale", torch.full((n,), float("nan"), dtype=torch.float32),
                  output_dim=0, weight_loader=per_channel_scale_loader(layer),
                  dummy_init=_int8_scale_init)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        require(not torch.isnan(layer.weight_scale).any(), layer, "weight_scale was not loaded")

    def apply(self, layer: nn.Module, x: torch.Tensor,
              bias: torch.Tensor | None = None) -> torch.Tensor:
        return int8_linear(x, layer.weight, layer.weight_scale, bias)


def _int8_scale_init(tensor: torch.Tensor, generator: torch.Generator) -> None:
    """Dummy weights (zeros for int tensors) with a scale of normal(0, 0.02)'s 4 sigma / 127."""
    tensor.fill_(0.08 / 127.0)
