"""The contract between linear layers (engine/) and quantization methods (quant/).

A linear layer never knows how its weight is stored. It asks its method to create
parameters, lets the loader fill them through each parameter's ``weight_loader``,
calls ``process_weights_after_loading`` once, then ``apply`` on every forward.

Parameter attributes the layer's weight loaders read (set with ``set_weight_attrs``):

- ``input_dim`` / ``output_dim``: which tensor dim runs along K (in) / N (out), or absent.
- ``packed_dim`` + ``packed_factor``: the dim holding several values per element
  (e.g. AWQ qweight packs 8 int4 along N: packed_dim=1, packed_factor=8); shard
  offsets along that dim are divided by the factor.
- ``group_dim`` + ``group_size``: rows per element along K for group-wise tensors.
- ``is_per_shard_scalar``: one value per fused shard (FP8 per-tensor ``weight_scale``,
  ``input_scale``); the parameter has ``len(output_partition_sizes)`` elements and the
  loader writes shard i's scalar at index i.
- ``ignore_shard``: a tensor identical for every shard (e.g. GPTQ ``g_idx``); loaded once.
- ``group_index``: the group of each input row (GPTQ ``g_idx``); a row-parallel rank
  renumbers its part from its first group (act-order: ``engine/distributed/row_shards.py``).
- ``holds_shape``: the layer's ``[N, K]`` as values (compressed-tensors ``weight_shape``);
  a tensor-parallel rank loads its own shape instead.

A fused layer (q/k/v or gate/up) is one parameter set covering all shards along N;
the loader copies each checkpoint shard into its slice.

A mixture-of-experts layer (``FusedMoE``) has a ``FusedMoEMethodBase`` instead: its
parameters stack all experts, named ``w13_<tensor>`` (gate and up) and ``w2_<tensor>``
(down) after the checkpoint's per-expert tensor names (``experts.<e>.<proj>.<tensor>``:
``weight``, ``qweight``, ``scales``, ``weight_scale``, ...). Dim 0 is the expert; a w13
parameter's ``shard_dim`` is the dim of one expert's tensor along which gate (shard 0)
and up (shard 1) sit side by side.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch
from torch import nn


def set_weight_attrs(param: torch.Tensor, attrs: dict[str, Any]) -> None:
    for key, value in attrs.items():
        if hasattr(param, key):
            raise AttributeError(f"weight attribute {key!r} is already set")
        setattr(param, key, value)


class LinearMethodBase(ABC):
    """How one linear layer stores and applies its weight."""

    @abstractmethod
    def create_weights(self, layer: nn.Module, input_size: int,
                       output_partition_sizes: list[int], params_dtype: torch.dtype) -> None:
        """Registers parameters on ``layer``. ``output_partition_sizes`` lists each fused
        shard's N (one entry for a plain layer); their sum is the layer's N."""

    @abstractmethod
    def apply(self, layer: nn.Module, x: torch.Tensor,
              bias: torch.Tensor | None = None) -> torch.Tensor:
        """x: [..., K] -> [..., N] in x's dtype."""

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """Called once after every parameter is loaded (repack, transpose, check)."""


class FusedMoEMethodBase(ABC):
    """How one mixture-of-experts layer stores its experts' weights."""

    @abstractmethod
    def create_weights(self, layer: nn.Module, num_experts: int, hidden_size: int,
                       intermediate_size: int, params_dtype: torch.dtype) -> None:
        """Registers the stacked ``w13_*`` / ``w2_*`` parameters on ``layer``."""

    @abstractmethod
    def expert_weights(self, layer: nn.Module) -> tuple[Any, Any]:
        """(w13, w2) in a form ``tamis.kernels.fused_moe.fused_experts`` takes."""

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """Called once after every parameter is loaded (repack, check)."""

    @staticmethod
    def stacked_shapes(hidden_size: int, intermediate_size: int) -> dict[str, tuple]:
        """Per expert, stack -> ((out_features, in_features), shard dim): w13 holds gate
        then up (their rows shard), w2 is down (loaded whole)."""
        return {"w13": ((2 * intermediate_size, hidden_size), 0),
                "w2": ((hidden_size, intermediate_size), None)}


class QuantizationConfig(ABC):
    """A checkpoint's quantization, parsed from ``quantization_config`` (quant/ implements)."""

    @abstractmethod
    def get_name(self) -> str: ...

    @abstractmethod
    def get_linear_method(self, prefix: str) -> LinearMethodBase:
        """The method for the linear layer at ``prefix`` (e.g. "model.layers.0.mlp.down_proj");
        layers listed as ignored / not converted get the unquantized method."""
