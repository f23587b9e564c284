"""Block-wise FP8 experts (``quant_method: fp8`` with ``weight_block_size: [128, 128]``, as
DeepSeek-V3 and Qwen3-30B-A3B-FP8 ship them).

Per expert the tensors are the dense block format's (``quant/fp8_block.py``), stacked::

    w13_weight            float8_e4m3fn [E, 2I, H]
    w13_weight_scale_inv  float32 [E, 2 * ceil(I/128), ceil(H/128)]   gate's block rows,
                                                                       then up's
    w2_weight             float8_e4m3fn [E, H, I]
    w2_weight_scale_inv   float32 [E, ceil(H/128), ceil(I/128)]

Gate and up keep their own block rows, so an intermediate size that is not whole blocks
ends each in a partial block, as the checkpoint's per-projection scales are cut. The
kernel (``tamis.kernels.fused_moe_fp8_block``) runs W8A8 with activations quantized per
token and group of 128 on FP8 GPUs; elsewhere the reference dequantizes one expert at a
time (W8A16), which is what transformers runs on a CPU.
"""
from __future__ import annotations

import torch
from torch import nn

from tamis.engine.layers.quant_method import FusedMoEMethodBase
from tamis.kernels.fp8 import FP8_DTYPE
from tamis.kernels.moe_weights import Fp8BlockExperts
from tamis.quant.base import require
from tamis.quant.dummy import fp8_scale_init, fp8_weight_init
from tamis.quant.fp8 import check_fp8_device

STACKS = ("w13", "w2")


def _blocks(size: int, block: int) -> int:
    return -(-size // block)


class Fp8BlockMoEMethod(FusedMoEMethodBase):
    def __init__(self, block: tuple[int, int]):
        self.block = block

    def _shard_rows(self, layer: nn.Module, stack: str) -> int:
        """Rows of one projection: w13 holds gate and up of I rows each, w2 one of H."""
        return layer.intermediate_size if stack == "w13" else layer.hidden_size

    def create_weights(self, layer: nn.Module, num_experts: int, hidden_size: int,
                       intermediate_size: int, params_dtype: torch.dtype) -> None:
        block_n, block_k = self.block
        shapes = {"w13": (2, intermediate_size, hidden_size),
                  "w2": (1, hidden_size, intermediate_size)}
        for stack, (shards, rows, k) in shapes.items():
            shard_dim = 0 if shards == 2 else None
            layer.add_expert_param(f"{stack}_weight", torch.empty(
                num_experts, shards * rows, k, dtype=FP8_DTYPE), shard_dim,
                dummy_init=fp8_weight_init)
            layer.add_expert_param(f"{stack}_weight_scale_inv", torch.full(
                (num_experts, shards * _blocks(rows, block_n), _blocks(k, block_k)),
                float("nan")), shard_dim, dummy_init=fp8_scale_init)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        for stack in STACKS:
            require(not torch.isnan(getattr(layer, f"{stack}_weight_scale_inv")).any(), layer,
                    f"{stack} weight_scale_inv was not loaded for every expert")
        check_fp8_device(layer, layer.w13_weight.device)

    def expert_weights(self, layer: nn.Module) -> tuple[Fp8BlockExperts, Fp8BlockExperts]:
        return tuple(Fp8BlockExperts(getattr(layer, f"{stack}_weight"),
                                     getattr(layer, f"{stack}_weight_scale_inv"),
                                     self._shard_rows(layer, stack), self.block)
                     for stack in STACKS)
