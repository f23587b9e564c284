"""Integer-quantized experts (AWQ, GPTQ, compressed-tensors pack-quantized), kept packed.

Each method loads the checkpoint's per-expert tensors, stacked in the checkpoint's own
layout (one expert's tensor is exactly the dense format's, see ``quant/awq.py``,
``quant/gptq.py``, ``quant/compressed_tensors.py``)::

    AWQ      w13_qweight [E, H, 2I/8]  w13_qzeros [E, H/G, 2I/8]  w13_scales [E, H/G, 2I]
    GPTQ     w13_qweight [E, H/P, 2I]  w13_qzeros [E, G, 2I/P]    w13_scales [E, G, 2I]
             w13_g_idx [E, 2, H]       (gate's and up's, which must agree)
    CT       w13_weight_packed [E, 2I, ceil(H/P)]  w13_weight_scale [E, 2I, G]
             w13_weight_zero_point [E, 2I/P, G] (asymmetric)  w13_weight_shape [E, 2, 2]
             w13_weight_g_idx [E, 2, H] (act-order)
    (w2_* alike with K = I, N = H, one shard)

and after loading repacks them, expert by expert, into the layout the fused-MoE kernel
reads (``tamis.kernels.moe_weights.WNA16Experts``: codes packed along K, float zero
points, the group index kept only for act-order), 4 or 8 bits a weight as in the file.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from tamis.engine.layers.quant_method import FusedMoEMethodBase
from tamis.kernels.moe_weights import WNA16Experts
from tamis.quant.base import replace_param, require
from tamis.quant.dummy import DummyInit, values_init
from tamis.quant.packing import pack_int32, unpack_awq, unpack_int32

STACKS = ("w13", "w2")


def stack_shape(layer: nn.Module, stack: str) -> tuple[int, int]:
    """(N, K) of one expert's projection in ``stack``: w13 [2I, H], w2 [H, I]."""
    h, i = layer.hidden_size, layer.intermediate_size
    return (2 * i, h) if stack == "w13" else (h, i)


def expert_group_index_init(group_size: int, act_order: bool) -> DummyInit:
    """g_idx [E, ..., K]: row k in group k // group_size, shuffled per expert (the same
    order for gate and up) when ``act_order``."""
    def init(tensor: torch.Tensor, generator: torch.Generator) -> None:
        k = tensor.shape[-1]
        groups = torch.arange(k, device=tensor.device) // group_size
        for expert in range(tensor.shape[0]):
            order = (torch.randperm(k, generator=generator, device=tensor.device)
                     if act_order else torch.arange(k, device=tensor.device))
            tensor[expert] = groups[order].to(tensor.dtype)
    return init


def finalize_wna16_experts(layer: nn.Module, stack: str, codes_of: Callable[[int], torch.Tensor],
                           scales: torch.Tensor, zeros: torch.Tensor, group_size: int,
                           bits: int, g_idx: torch.Tensor | None = None) -> None:
    """Stores ``stack``'s experts as ``WNA16Experts`` parameters and drops the
    checkpoint's. ``codes_of(e)``: expert e's codes int [K, N]; scales and zeros
    [E, G, N]; ``g_idx`` int [E, K] or None."""
    n, k = stack_shape(layer, stack)
    groups = -(-k // group_size)
    require(tuple(scales.shape) == (layer.num_experts, groups, n), layer,
            f"{stack} scales have shape {tuple(scales.shape)}, expected "
            f"{(layer.num_experts, groups, n)}")
    packed = torch.stack([pack_int32(codes_of(e), bits, dim=0)
                          for e in range(layer.num_experts)])
    if g_idx is not None:
        g_idx = _act_order_only(layer, stack, g_idx, group_size, groups)
    for name in [name for name, _ in layer.named_parameters(recurse=False)
                 if name.startswith(f"{stack}_")]:
        delattr(layer, name)
    exact_in_fp16 = torch.equal(scales.float().half().float(), scales.float())
    dtype = torch.float16 if exact_in_fp16 else torch.float32
    replace_param(layer, f"{stack}_wna16_qweight", packed)
    replace_param(layer, f"{stack}_wna16_scales", scales.to(dtype).contiguous())
    replace_param(layer, f"{stack}_wna16_zeros", zeros.to(dtype).contiguous())
    if g_idx is not None:
        replace_param(layer, f"{stack}_wna16_g_idx", g_idx)
    layer.wna16_formats = {**getattr(layer, "wna16_formats", {}), stack: (group_size, bits, k)}


def _act_order_only(layer: nn.Module, stack: str, g_idx: torch.Tensor, group_size: int,
                    groups: int) -> torch.Tensor | None:
    """int32 [E, K] when some expert's rows are not in natural group order, else None."""
    require(bool((g_idx >= 0).all() and (g_idx < groups).all()), layer,
            f"{stack} g_idx values must lie in [0, {groups})")
    natural = torch.arange(g_idx.shape[-1], device=g_idx.device) // group_size
    if bool((g_idx == natural).all()):
        return None
    return g_idx.to(torch.int32).contiguous()


def wna16_experts(layer: nn.Module, stack: str) -> WNA16Experts:
    group_size, bits, k = layer.wna16_formats[stack]
    return WNA16Experts(getattr(layer, f"{stack}_wna16_qweight"),
                        getattr(layer, f"{stack}_wna16_scales"),
                        getattr(layer, f"{stack}_wna16_zeros"), group_size, bits, k,
                        getattr(layer, f"{stack}_wna16_g_idx", None))


def shared_g_idx(layer: nn.Module, stack: str, g_idx: torch.Tensor) -> torch.Tensor:
    """[E, K] from w13's [E, 2, K] (gate's and up's must be equal: one K order per
    expert) or w2's [E, K]."""
    if stack == "w2":
        return g_idx
    differ = (g_idx[:, 0] != g_idx[:, 1]).any(dim=1).nonzero()
    require(differ.numel() == 0, layer,
            f"gate and up projections of expert {differ.flatten()[:1].tolist()} have "
            f"different g_idx; tamis needs one input order per expert")
    return g_idx[:, 0]


class WNA16MoEMethod(FusedMoEMethodBase):
    def expert_weights(self, layer: nn.Module) -> tuple[WNA16Experts, WNA16Experts]:
        return wna16_experts(layer, "w13"), wna16_experts(layer, "w2")


class AWQMoEMethod(WNA16MoEMethod):
    def __init__(self, config):
        self.config = config

    def create_weights(self, layer: nn.Module, num_experts: int, hidden_size: int,
                       intermediate_size: int, params_dtype: torch.dtype) -> None:
        group = self.config.group_size
        for stack in STACKS:
            n, k = stack_shape(layer, stack)
            shard_dim = 1 if stack == "w13" else None
            projection_n = n // 2 if shard_dim else n
            require(k % group == 0 and projection_n % 8 == 0, layer,
                    f"AWQ experts need K divisible by the group size {group} and each "
                    f"projection's N by 8: {stack} has N={projection_n}, K={k}")
            layer.add_expert_param(f"{stack}_qweight", torch.empty(
                num_experts, k, n // 8, dtype=torch.int32), shard_dim)
            layer.add_expert_param(f"{stack}_qzeros", torch.empty(
                num_experts, k // group, n // 8, dtype=torch.int32), shard_dim)
            layer.add_expert_param(f"{stack}_scales", torch.empty(
                num_experts, k // group, n, dtype=torch.float32), shard_dim)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        for stack in STACKS:
            qweight = getattr(layer, f"{stack}_qweight").data
            qzeros = getattr(layer, f"{stack}_qzeros").data
            zeros = torch.stack([unpack_awq(qzeros[e]) for e in range(layer.num_experts)])
            zeros = zeros.float() if self.config.zero_point else torch.full_like(
                zeros, 8, dtype=torch.float32)
            finalize_wna16_experts(layer, stack, lambda e: unpack_awq(qweight[e]),
                                   getattr(layer, f"{stack}_scales").data, zeros,
                                   self.config.group_size, bits=4)


class GPTQMoEMethod(WNA16MoEMethod):
    def __init__(self, config):
        self.config = config

    def _group(self, k: int) -> int:
        return k if self.config.group_size == -1 else self.config.group_size

    def create_weights(self, layer: nn.Module, num_experts: int, hidden_size: int,
                       intermediate_size: int, params_dtype: torch.dtype) -> None:
        pack = self.config.pack_factor
        for stack in STACKS:
            n, k = stack_shape(layer, stack)
            require(k % pack == 0 and n % (2 * pack if stack == "w13" else pack) == 0, layer,
                    f"GPTQ {self.config.bits}-bit experts pack {pack} values per int32: "
                    f"{stack} has N={n}, K={k}")
            group = self._group(k)
            groups = -(-k // group)
            shard_dim = 1 if stack == "w13" else None
            layer.add_expert_param(f"{stack}_qweight", torch.empty(
                num_experts, k // pack, n, dtype=torch.int32), shard_dim)
            layer.add_expert_param(f"{stack}_qzeros", torch.empty(
                num_experts, groups, n // pack, dtype=torch.int32), shard_dim)
            layer.add_expert_param(f"{stack}_scales", torch.empty(
                num_experts, groups, n, dtype=torch.float32), shard_dim)
            g_idx_shape = (num_experts, 2, k) if stack == "w13" else (num_experts, k)
            layer.add_expert_param(
                f"{stack}_g_idx", torch.empty(g_idx_shape, dtype=torch.int32),
                0 if stack == "w13" else None,
                dummy_init=expert_group_index_init(group, self.config.desc_act))

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        bits = self.config.bits
        for stack in STACKS:
            n, k = stack_shape(layer, stack)
            qweight = getattr(layer, f"{stack}_qweight").data
            qzeros = getattr(layer, f"{stack}_qzeros").data
            zeros = torch.stack([unpack_int32(qzeros[e], bits, dim=1, length=n)
                                 for e in range(layer.num_experts)]).float()
            if self.config.checkpoint_format == "gptq":
                zeros = zeros + 1  # v1 stores zero - 1
            g_idx = shared_g_idx(layer, stack, getattr(layer, f"{stack}_g_idx").data)
            finalize_wna16_experts(
                layer, stack, lambda e: unpack_int32(qweight[e], bits, dim=0, length=k),
                getattr(layer, f"{stack}_scales").data, zeros, self._group(k), bits, g_idx)


class CompressedTensorsWNA16MoEMethod(WNA16MoEMethod):
    def __init__(self, bits: int, group_size: int | None, sym: bool, act_order: bool):
        self.bits, self.group_size, self.sym, self.act_order = bits, group_size, sym, act_order

    def create_weights(self, layer: nn.Module, num_experts: int, hidden_size: int,
                       intermediate_size: int, params_dtype: torch.dtype) -> None:
        pack = 32 // self.bits
        for stack in STACKS:
            n, k = stack_shape(layer, stack)
            group = self.group_size or k
            groups = -(-k // group)
            w13 = stack == "w13"
            shard_dim = 0 if w13 else None
            layer.add_expert_param(f"{stack}_weight_packed", torch.empty(
                num_experts, n, -(-k // pack), dtype=torch.int32), shard_dim)
            layer.add_expert_param(f"{stack}_weight_scale", torch.empty(
                num_experts, n, groups, dtype=torch.float32), shard_dim)
            shape = [[n // 2, k]] * 2 if w13 else [n, k]
            layer.add_expert_param(f"{stack}_weight_shape", torch.zeros(
                (num_experts, 2, 2) if w13 else (num_experts, 2), dtype=torch.int64),
                shard_dim, dummy_init=values_init([shape] * num_experts))
            if not self.sym:
                require(n % (2 * pack if w13 else pack) == 0, layer,
                        f"packed zero points need each projection's N to be a multiple of "
                        f"{pack}: {stack} has N={n}")
                layer.add_expert_param(f"{stack}_weight_zero_point", torch.empty(
                    num_experts, n // pack, groups, dtype=torch.int32), shard_dim)
            if self.act_order:
                layer.add_expert_param(
                    f"{stack}_weight_g_idx", torch.empty(
                        (num_experts, 2, k) if w13 else (num_experts, k), dtype=torch.int32),
                    shard_dim, dummy_init=expert_group_index_init(group, True))

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        bits = self.bits
        for stack in STACKS:
            n, k = stack_shape(layer, stack)
            expected = [n // 2, k] if stack == "w13" else [n, k]
            shapes = getattr(layer, f"{stack}_weight_shape").data.reshape(-1, 2)
            require(bool((shapes.cpu() == torch.tensor(expected)).all()), layer,
                    f"{stack} weight_shape says {shapes.tolist()}, each expert's projection "
                    f"is {expected}")
            packed = getattr(layer, f"{stack}_weight_packed").data
            scales = getattr(layer, f"{stack}_weight_scale").data.transpose(1, 2)
            if self.sym:
                zeros = torch.full_like(scales, float(1 << (bits - 1)))
            else:
                zero_points = getattr(layer, f"{stack}_weight_zero_point").data
                zeros = torch.stack([unpack_int32(zero_points[e], bits, dim=0, length=n).t()
                                     for e in range(layer.num_experts)]).float()
            g_idx = None
            if self.act_order:
                g_idx = shared_g_idx(layer, stack, getattr(layer, f"{stack}_weight_g_idx").data)
            finalize_wna16_experts(
                layer, stack, lambda e: unpack_int32(packed[e], bits, dim=1, length=k).t(),
                scales, zeros, self.group_size or k, bits, g_idx)
