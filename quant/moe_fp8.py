"""FP8 experts: serialized checkpoints (vLLM ``fp8``, compressed-tensors float-quantized)
and online FP8 of a bf16/fp16/fp32 MoE checkpoint.

Per expert the tensors are the dense FP8 format's (``quant/fp8.py``), stacked::

    w13_weight        float8_e4m3fn [E, 2I, H]
    w13_weight_scale  float32 [E, 2I]   a per-tensor scale (one per expert and projection)
                                        repeated over its rows, or per-channel scales
    w13_input_scale   float32 [E, 2]    static activations only
    (w2_* alike: [E, H, I], [E, H], [E, 1])

Static input scales collapse to one per stack, their maximum over experts and
projections, as vLLM does: a token's activations are quantized once for all its
experts. Online FP8 quantizes each output channel of each expert with its own scale,
each stack as soon as all of its experts are loaded (``quant/online.py``): about one
layer's experts are in high precision at a time.
"""
from __future__ import annotations

import torch
from torch import nn

from tamis.engine.layers.quant_method import FusedMoEMethodBase
from tamis.kernels.fp8 import FP8_DTYPE
from tamis.kernels.moe_weights import Fp8Experts
from tamis.quant.base import replace_param, require
from tamis.quant.dummy import fp8_scale_init, fp8_weight_init, input_scale_init
from tamis.quant.fp8 import check_fp8_device, quantize_weight_per_channel
from tamis.quant.online import StagedWeight, placeholder

STACKS = ("w13", "w2")


def _scale_loader(layer: nn.Module):
    """An expert's weight_scale, scalar (per-tensor) or one per row (per-channel), into
    its rows of the [E, N] vector."""
    def load(param: torch.Tensor, loaded: torch.Tensor, shard_id=None) -> None:
        target = layer.expert_slice(param, shard_id)
        if loaded.numel() == 1:
            target.fill_(loaded.float().reshape(()).item())
        elif loaded.numel() == target.numel():
            target.copy_(loaded.float().reshape(target.shape))
        else:
            raise ValueError(f"{layer.prefix}: weight_scale has shape {tuple(loaded.shape)}; "
                             f"expected a scalar (per-tensor) or {target.numel()} values "
                             f"(per-channel)")
    return load


def fp8_experts(layer: nn.Module, stack: str) -> Fp8Experts:
    return Fp8Experts(getattr(layer, f"{stack}_weight"), getattr(layer, f"{stack}_weight_scale"),
                      getattr(layer, f"{stack}_input_scale", None))


class Fp8MoEMethod(FusedMoEMethodBase):
    def __init__(self, static: bool):
        self.static = static

    def create_weights(self, layer: nn.Module, num_experts: int, hidden_size: int,
                       intermediate_size: int, params_dtype: torch.dtype) -> None:
        for stack, ((n, k), shard_dim) in self.stacked_shapes(hidden_size,
                                                              intermediate_size).items():
            layer.add_expert_param(f"{stack}_weight", torch.empty(
                num_experts, n, k, dtype=FP8_DTYPE), shard_dim, dummy_init=fp8_weight_init)
            layer.add_expert_param(
                f"{stack}_weight_scale", torch.full((num_experts, n), float("nan")), shard_dim,
                weight_loader=_scale_loader(layer), dummy_init=fp8_scale_init)
            if self.static:
                layer.add_expert_param(
                    f"{stack}_input_scale",
                    torch.full((num_experts, 2 if shard_dim == 0 else 1), float("nan")),
                    shard_dim, dummy_init=input_scale_init)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        for stack in STACKS:
            require(not torch.isnan(getattr(layer, f"{stack}_weight_scale")).any(), layer,
                    f"{stack} weight_scale was not loaded for every expert")
            if self.static:
                scales = getattr(layer, f"{stack}_input_scale").data
                require(not torch.isnan(scales).any(), layer, f"activation_scheme is 'static' "
                        f"but {stack} input_scale was not loaded for every expert")
                replace_param(layer, f"{stack}_input_scale", scales.max().reshape(()))
        check_fp8_device(layer, layer.w13_weight.device)

    def expert_weights(self, layer: nn.Module) -> tuple[Fp8Experts, Fp8Experts]:
        return fp8_experts(layer, "w13"), fp8_experts(layer, "w2")


class OnlineFp8MoEMethod(Fp8MoEMethod):
    """Quantizes the checkpoint's high-precision experts per channel, each stack as soon
    as all of its experts' shards are loaded."""

    def __init__(self):
        super().__init__(static=False)

    def create_weights(self, layer: nn.Module, num_experts: int, hidden_size: int,
                       intermediate_size: int, params_dtype: torch.dtype) -> None:
        for stack, ((n, k), shard_dim) in self.stacked_shapes(hidden_size,
                                                              intermediate_size).items():
            staged = StagedWeight(layer.weight_loader, quantize_experts_per_channel)
            layer.add_expert_param(f"{stack}_weight",
                                   placeholder((num_experts, n, k), params_dtype), shard_dim,
                                   **staged.attrs())

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        for stack in STACKS:
            codes, scales = getattr(layer, f"{stack}_weight").staged.take_quantized(layer)
            replace_param(layer, f"{stack}_weight", codes)
            replace_param(layer, f"{stack}_weight_scale", scales)
        check_fp8_device(layer, layer.w13_weight.device)


def quantize_experts_per_channel(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[E, N, K] -> (float8 [E, N, K], float32 [E, N]): ``quantize_weight_per_channel``
    per expert (one expert's float32 workspace at a time)."""
    codes = torch.empty(weight.shape, dtype=FP8_DTYPE, device=weight.device)
    scales = torch.empty(weight.shape[:2], dtype=torch.float32, device=weight.device)
    for expert in range(weight.shape[0]):
        codes[expert], scales[expert] = quantize_weight_per_channel(weight[expert])
    return codes, scales
