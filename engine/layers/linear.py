"""Linear layers whose storage is delegated to a linear method (see quant_method.py).

Every layer calls ``quant_method.create_weights`` to register its parameters, then
gives each parameter that has none its own ``weight_loader(param, loaded, shard_id)``.
The loaders are generic over parameter names: they read only the attributes listed in
``quant_method.py`` (``output_dim``, ``packed_dim``/``packed_factor``,
``is_per_shard_scalar``, ``ignore_shard``), so a quant method's ``qweight``,
``scales``, ``qzeros``, ``weight_scale`` ... load without this file knowing them.

Fused layers lay their shards out along N::

    QKVLinear.weight  [q_size + kv_size + kv_size, K]    shard_id "q" | "k" | "v"
    MergedColumnLinear.weight  [N0 + N1 + ..., K]          shard_id 0 | 1 | ...
"""
from __future__ import annotations

import torch
from torch import nn

from tamis.engine.layers.quant_method import (LinearMethodBase, QuantizationConfig,
                                              set_weight_attrs)


class UnquantizedLinearMethod(LinearMethodBase):
    """A plain ``weight [N, K]`` in the model dtype."""

    def create_weights(self, layer: nn.Module, input_size: int,
                       output_partition_sizes: list[int], params_dtype: torch.dtype) -> None:
        weight = nn.Parameter(torch.empty(sum(output_partition_sizes), input_size,
                                          dtype=params_dtype), requires_grad=False)
        set_weight_attrs(weight, {"input_dim": 1, "output_dim": 0})
        layer.register_parameter("weight", weight)

    def apply(self, layer: nn.Module, x: torch.Tensor,
              bias: torch.Tensor | None = None) -> torch.Tensor:
        from tamis.kernels.gemv import linear  # lazy, as in the other layers: no Triton at import
        return linear(x, layer.weight, bias)   # F.linear; a split-K GEMV for one CUDA row


def get_linear_method(quant_config: QuantizationConfig | None, prefix: str) -> LinearMethodBase:
    """The quant config's method for the layer at ``prefix``, or the unquantized one."""
    if quant_config is None:
        return UnquantizedLinearMethod()
    return quant_config.get_linear_method(prefix)


class LinearBase(nn.Module):
    """A linear layer ``[..., K] -> [..., N]`` with ``N = sum(output_partition_sizes)``."""

    def __init__(self, input_size: int, output_partition_sizes: list[int], bias: bool = False,
                 quant_config: QuantizationConfig | None = None, prefix: str = "",
                 params_dtype: torch.dtype | None = None):
        super().__init__()
        self.input_size = input_size
        self.output_partition_sizes = list(output_partition_sizes)
        self.output_size = sum(self.output_partition_sizes)
        self.prefix = prefix
        self.params_dtype = params_dtype or torch.get_default_dtype()
        self.quant_method = get_linear_method(quant_config, prefix)
        self.quant_method.create_weights(self, input_size, self.output_partition_sizes,
                                         self.params_dtype)
        if bias:
            self.bias = nn.Parameter(torch.empty(self.output_size, dtype=self.params_dtype),
                                     requires_grad=False)
            set_weight_attrs(self.bias, {"output_dim": 0})
        else:
            self.register_parameter("bias", None)
        for param in self.parameters(recurse=False):
            if not hasattr(param, "weight_loader"):
                set_weight_attrs(param, {"weight_loader": self.weight_loader})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.quant_method.apply(self, x, self.bias)

    def process_weights_after_loading(self) -> None:
        self.quant_method.process_weights_after_loading(self)

    def shard_index(self, shard_id) -> int:
        raise ValueError(f"{type(self).__name__} at {self.prefix!r} has no shard {shard_id!r}")

    def weight_loader(self, param: torch.Tensor, loaded: torch.Tensor, shard_id=None) -> None:
        """Copies a checkpoint tensor (one whole tensor, or shard ``shard_id``) into ``param``."""
        if shard_id is None:
            _copy_checked(param.data, loaded, self.prefix)
            return
        index = self.shard_index(shard_id)
        if getattr(param, "is_per_shard_scalar", False):
            _copy_checked(param.data[index:index + 1], loaded.reshape(1), self.prefix)
            return
        output_dim = getattr(param, "output_dim", None)
        if getattr(param, "ignore_shard", False) or output_dim is None:
            _copy_checked(param.data, loaded, self.prefix)
            return
        offset = sum(self.output_partition_sizes[:index])
        size = self.output_partition_sizes[index]
        if getattr(param, "packed_dim", None) == output_dim:
            factor = param.packed_factor
            offset, size = offset // factor, size // factor
        _copy_checked(param.data.narrow(output_dim, offset, size), loaded, self.prefix)


def _copy_checked(target: torch.Tensor, loaded: torch.Tensor, prefix: str) -> None:
    if target.shape != loaded.shape:
        raise ValueError(f"{prefix}: checkpoint tensor has shape {tuple(loaded.shape)}, "
                         f"the layer expects {tuple(target.shape)}")
    target.copy_(loaded)


class ReplicatedLinear(LinearBase):
    """One unfused linear layer (also used for o_proj / down_proj: no tensor parallelism yet)."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False,
                 quant_config: QuantizationConfig | None = None, prefix: str = "",
                 params_dtype: torch.dtype | None = None):
        super().__init__(input_size, [output_size], bias, quant_config, prefix, params_dtype)


class RowLinear(ReplicatedLinear):
    """The row-split layer of a block (o_proj, down_proj); ReplicatedLinear on one device."""


class MergedColumnLinear(LinearBase):
    """Several linears over the same input fused along N (gate_up_proj); shard ids 0, 1, ..."""

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool = False,
                 quant_config: QuantizationConfig | None = None, prefix: str = "",
                 params_dtype: torch.dtype | None = None):
        super().__init__(input_size, output_sizes, bias, quant_config, prefix, params_dtype)

    def shard_index(self, shard_id) -> int:
        if not isinstance(shard_id, int) or not 0 <= shard_id < len(self.output_partition_sizes):
            return super().shard_index(shard_id)
        return shard_id


class QKVLinear(LinearBase):
    """q, k and v projections fused along N; shard ids "q", "k", "v" (or 0, 1, 2)."""

    _SHARDS = {"q": 0, "k": 1, "v": 2, 0: 0, 1: 1, 2: 2}

    def __init__(self, hidden_size: int, head_dim: int, num_heads: int, num_kv_heads: int,
                 bias: bool = False, quant_config: QuantizationConfig | None = None,
                 prefix: str = "", params_dtype: torch.dtype | None = None):
        self.q_size = num_heads * head_dim
        self.kv_size = num_kv_heads * head_dim
        super().__init__(hidden_size, [self.q_size, self.kv_size, self.kv_size], bias,
                         quant_config, prefix, params_dtype)

    def shard_index(self, shard_id) -> int:
        if isinstance(shard_id, bool) or shard_id not in self._SHARDS:
            return super().shard_index(shard_id)
        return self._SHARDS[shard_id]
