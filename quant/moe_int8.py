"""INT8 W8A8 experts (compressed-tensors ``int-quantized``: symmetric per-channel int8
weights, dynamic symmetric per-token int8 activations; dense format in ``quant/int8.py``).

Per expert the tensors are the dense format's, stacked::

    w13_weight        int8 [E, 2I, H]
    w13_weight_scale  float32 [E, 2I]    (the checkpoint's [N, 1] per projection)
    w2_weight         int8 [E, H, I]
    w2_weight_scale   float32 [E, H]

The experts always run W8A8 (``tamis.kernels.fused_moe``: an int8 dot into int32, the
scales after it), the reference on a CPU as well, as the dense INT8 layers do.
"""
from __future__ import annotations

import torch
from torch import nn

from tamis.engine.layers.quant_method import FusedMoEMethodBase
from tamis.kernels.moe_weights import Int8Experts
from tamis.quant.base import require

STACKS = ("w13", "w2")


def _int8_scale_init(tensor: torch.Tensor, generator: torch.Generator) -> None:
    """Dummy weights: normal(0, 0.02)'s 4 sigma over 127 codes."""
    tensor.fill_(0.08 / 127.0)


class Int8MoEMethod(FusedMoEMethodBase):
    def create_weights(self, layer: nn.Module, num_experts: int, hidden_size: int,
                       intermediate_size: int, params_dtype: torch.dtype) -> None:
        for stack, ((n, k), shard_dim) in self.stacked_shapes(hidden_size,
                                                              intermediate_size).items():
            layer.add_expert_param(f"{stack}_weight", torch.empty(
                num_experts, n, k, dtype=torch.int8), shard_dim)
            layer.add_expert_param(f"{stack}_weight_scale", torch.full(
                (num_experts, n), float("nan")), shard_dim, dummy_init=_int8_scale_init)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        for stack in STACKS:
            require(not torch.isnan(getattr(layer, f"{stack}_weight_scale")).any(), layer,
                    f"{stack} weight_scale was not loaded for every expert")

    def expert_weights(self, layer: nn.Module) -> tuple[Int8Experts, Int8Experts]:
        return tuple(Int8Experts(getattr(layer, f"{stack}_weight"),
                                 getattr(layer, f"{stack}_weight_scale")) for stack in STACKS)
