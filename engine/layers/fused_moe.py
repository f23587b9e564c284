"""Routed experts: the experts' stacked weights; routing (softmax, top-k) runs in
``tamis.kernels.moe_routing``.

``FusedMoE`` holds all experts of one layer in stacked parameters that its method
(``FusedMoEMethodBase``: unquantized here, quantized ones in ``tamis.quant.moe``) creates.
Unquantized::

    w13_weight  [E, 2I, H]   rows 0..I-1: expert e's gate_proj (w1), rows I..2I-1: up_proj (w3)
    w2_weight   [E, H, I]    expert e's down_proj (w2)

Checkpoints store one tensor per expert, projection and tensor name; the model maps
``experts.<e>.<proj>.<tensor>`` to ``(w13_<tensor> | w2_<tensor>, (e, shard))``
(``CausalLMBase.expert_weight_names``) and the parameter's ``weight_loader`` copies it
into its slice. The kernel runs in ``tamis.kernels.fused_moe``.
"""
from __future__ import annotations

import torch
from torch import nn

from tamis.engine.layers.quant_method import (FusedMoEMethodBase, QuantizationConfig,
                                              set_weight_attrs)


def select_experts(router_logits: torch.Tensor, top_k: int,
                   renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights float32 [T, top_k], expert ids int32 [T, top_k]): softmax over the experts,
    the top_k, renormalised when asked (``tamis.kernels.moe_routing``)."""
    from tamis.kernels.moe_routing import select_experts as route  # lazy: no Triton at import
    return route(router_logits, top_k, renormalize)


class UnquantizedFusedMoEMethod(FusedMoEMethodBase):
    """``w13_weight`` / ``w2_weight`` in the model dtype."""

    def create_weights(self, layer: nn.Module, num_experts: int, hidden_size: int,
                       intermediate_size: int, params_dtype: torch.dtype) -> None:
        for stack, ((n, k), shard_dim) in self.stacked_shapes(hidden_size,
                                                              intermediate_size).items():
            layer.add_expert_param(f"{stack}_weight", torch.empty(
                num_experts, n, k, dtype=params_dtype), shard_dim)

    def expert_weights(self, layer: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
        return layer.w13_weight, layer.w2_weight


def get_moe_method(quant_config: QuantizationConfig | None, prefix: str) -> FusedMoEMethodBase:
    """The unquantized method, or the quant config's (``tamis.quant.moe``, imported only
    for a quantized model)."""
    if quant_config is None:
        return UnquantizedFusedMoEMethod()
    from tamis.quant.moe import get_moe_method as quantized_moe_method
    return quantized_moe_method(quant_config, prefix)


def _same_but_unit_dims(a: torch.Size, b: torch.Size) -> bool:
    return [d for d in a if d != 1] == [d for d in b if d != 1]


class FusedMoE(nn.Module):
    """``num_experts`` gated MLPs of size ``intermediate_size``, ``top_k`` per token."""

    def __init__(self, num_experts: int, top_k: int, hidden_size: int, intermediate_size: int,
                 renormalize: bool, quant_config: QuantizationConfig | None = None,
                 prefix: str = ""):
        super().__init__()
        if not 0 < top_k <= num_experts:
            raise ValueError(f"{prefix}: num_experts_per_tok={top_k} must be in 1..{num_experts}")
        self.num_experts, self.top_k, self.renormalize = num_experts, top_k, renormalize
        self.hidden_size, self.intermediate_size, self.prefix = \
            hidden_size, intermediate_size, prefix
        self.params_dtype = torch.get_default_dtype()
        self.quant_method = get_moe_method(quant_config, prefix)
        self.quant_method.create_weights(self, num_experts, hidden_size, intermediate_size,
                                         self.params_dtype)

    def add_expert_param(self, name: str, tensor: torch.Tensor, shard_dim: int | None = None,
                         **attrs) -> nn.Parameter:
        """Registers a stacked parameter [E, ...]; ``shard_dim`` for w13 ones (see
        ``quant_method.py``); ``attrs`` may bring its own ``weight_loader``."""
        param = nn.Parameter(tensor, requires_grad=False)
        attrs.setdefault("weight_loader", self.weight_loader)
        set_weight_attrs(param, {**attrs, "shard_dim": shard_dim})
        self.register_parameter(name, param)
        return param

    def expert_slice(self, param: torch.Tensor, shard_id) -> torch.Tensor:
        """The view of ``param`` that expert ``shard_id[0]``'s shard ``shard_id[1]`` fills."""
        if not isinstance(shard_id, tuple):
            raise ValueError(f"{self.prefix}: stacked expert weights load per expert "
                             f"(experts.<id>.<projection>.<tensor>), got a whole tensor")
        expert, shard = shard_id
        if not 0 <= expert < self.num_experts:
            raise ValueError(f"{self.prefix}: expert {expert} is out of range: the config "
                             f"has {self.num_experts} experts")
        target = param.data[expert]
        shard_dim = getattr(param, "shard_dim", None)
        if shard_dim is None:
            if shard != 0:
                raise ValueError(f"{self.prefix}: down projections have one shard, got {shard}")
            return target
        size = target.shape[shard_dim] // 2
        return target.narrow(shard_dim, shard * size, size)

    def weight_loader(self, param: torch.Tensor, loaded: torch.Tensor,
                      shard_id: tuple[int, int] | None = None) -> None:
        """Copies expert ``shard_id[0]``'s tensor into its slice of ``param``: shard 0
        (gate) or 1 (up) of a w13 parameter, shard 0 of a w2 one. Shapes must agree up to
        dims of size 1 (a scalar scale fills a [1] slot)."""
        target = self.expert_slice(param, shard_id)
        if target.shape != loaded.shape and _same_but_unit_dims(target.shape, loaded.shape):
            loaded = loaded.reshape(target.shape)
        if target.shape != loaded.shape:
            raise ValueError(f"{self.prefix}: checkpoint tensor has shape "
                             f"{tuple(loaded.shape)}, the expert expects {tuple(target.shape)}")
        target.copy_(loaded)

    def forward(self, hidden: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        """hidden [T, H], router_logits [T, E] -> [T, H]."""
        from tamis.kernels.fused_moe import fused_experts  # lazy: no Triton at import
        weights, ids = select_experts(router_logits, self.top_k, self.renormalize)
        w13, w2 = self.quant_method.expert_weights(self)
        return fused_experts(hidden, w13, w2, weights, ids)


class SparseMoeBlock(nn.Module):
    """The MoE block of a decoder layer: a router (``gate``, one logit per expert) and the
    routed ``experts``; with ``shared_expert`` (Qwen2-MoE), that MLP runs on every token
    and is added scaled by ``sigmoid(shared_expert_gate(x))``."""

    def __init__(self, hidden_size: int, num_experts: int, top_k: int, intermediate_size: int,
                 renormalize: bool, quant_config: QuantizationConfig | None, prefix: str,
                 shared_expert: nn.Module | None = None):
        super().__init__()
        from tamis.engine.layers.linear import ReplicatedLinear
        self.gate = ReplicatedLinear(hidden_size, num_experts, prefix=f"{prefix}.gate")
        self.experts = FusedMoE(num_experts, top_k, hidden_size, intermediate_size, renormalize,
                                quant_config, f"{prefix}.experts")
        self.shared_expert = shared_expert
        if shared_expert is not None:
            self.shared_expert_gate = ReplicatedLinear(hidden_size, 1,
                                                       prefix=f"{prefix}.shared_expert_gate")

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        out = self.experts(hidden, self.gate(hidden))
        if self.shared_expert is not None:
            out = out + torch.sigmoid(self.shared_expert_gate(hidden)) * self.shared_expert(hidden)
        return out
