"""Routed experts: top-k routing and the experts' stacked weights.

``FusedMoE`` holds all experts of one layer in two parameters::

    w13_weight  [E, 2I, H]   rows 0..I-1: expert e's gate_proj (w1), rows I..2I-1: up_proj (w3)
    w2_weight   [E, H, I]    expert e's down_proj (w2)

Checkpoints store one tensor per expert and projection; the model maps each name to
``(parameter, (expert_id, shard))`` (``CausalLMBase.expert_weight_names``) and the
parameter's ``weight_loader`` copies it into its slice. The kernel runs in
``tamis.kernels.fused_moe``.
"""
from __future__ import annotations

import torch
from torch import nn

from tamis.engine.layers.quant_method import QuantizationConfig, set_weight_attrs


def select_experts(router_logits: torch.Tensor, top_k: int,
                   renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax over all experts (float32), the ``top_k`` largest, divided by their sum when
    ``renormalize`` (which equals a softmax over the top-k logits: Mixtral's routing).
    Returns (weights float32 [T, top_k], expert ids int32 [T, top_k])."""
    probs = torch.softmax(router_logits.float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids.to(torch.int32)


def refuse_quantized_experts(quant_config: QuantizationConfig | None, prefix: str) -> None:
    """Raises ValueError for a quantized MoE layer: experts load unquantized only."""
    if quant_config is not None:
        raise ValueError(
            f"{quant_config.get_name()} quantization of mixture-of-experts layers ({prefix}) "
            f"is not supported yet: serve the unquantized checkpoint of this model")


class FusedMoE(nn.Module):
    """``num_experts`` gated MLPs of size ``intermediate_size``, ``top_k`` per token."""

    def __init__(self, num_experts: int, top_k: int, hidden_size: int, intermediate_size: int,
                 renormalize: bool, quant_config: QuantizationConfig | None = None,
                 prefix: str = ""):
        super().__init__()
        refuse_quantized_experts(quant_config, prefix)
        if not 0 < top_k <= num_experts:
            raise ValueError(f"{prefix}: num_experts_per_tok={top_k} must be in 1..{num_experts}")
        self.num_experts, self.top_k, self.renormalize = num_experts, top_k, renormalize
        self.intermediate_size, self.prefix = intermediate_size, prefix
        self.w13_weight = self._stacked(num_experts, 2 * intermediate_size, hidden_size)
        self.w2_weight = self._stacked(num_experts, hidden_size, intermediate_size)

    def _stacked(self, *shape: int) -> nn.Parameter:
        param = nn.Parameter(torch.empty(*shape), requires_grad=False)
        set_weight_attrs(param, {"weight_loader": self.weight_loader})
        return param

    def weight_loader(self, param: torch.Tensor, loaded: torch.Tensor,
                      shard_id: tuple[int, int] | None = None) -> None:
        """Copies expert ``shard_id[0]``'s projection into its slice: shard 0 (gate) or 1
        (up) of ``w13_weight``, shard 0 of ``w2_weight``."""
        if not isinstance(shard_id, tuple):
            raise ValueError(f"{self.prefix}: stacked expert weights load per expert "
                             f"(experts.<id>.<projection>.weight), got a whole tensor")
        expert, shard = shard_id
        if not 0 <= expert < self.num_experts:
            raise ValueError(f"{self.prefix}: expert {expert} is out of range: the config "
                             f"has {self.num_experts} experts")
        target = param.data[expert]
        if param is self.w13_weight:
            target = target.narrow(0, shard * self.intermediate_size, self.intermediate_size)
        if target.shape != loaded.shape:
            raise ValueError(f"{self.prefix}: checkpoint tensor has shape "
                             f"{tuple(loaded.shape)}, the expert expects {tuple(target.shape)}")
        target.copy_(loaded)

    def forward(self, hidden: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        """hidden [T, H], router_logits [T, E] -> [T, H]."""
        from tamis.kernels.fused_moe import fused_experts  # lazy: no Triton at import
        weights, ids = select_experts(router_logits, self.top_k, self.renormalize)
        return fused_experts(hidden, self.w13_weight, self.w2_weight, weights, ids)


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
