"""Qwen3-MoE and Qwen2-MoE: the Qwen3 / Qwen2 decoders whose MLP is a sparse MoE block on
the layers ``decoder_sparse_step`` selects (all by default), minus ``mlp_only_layers``.

Routing: softmax over all experts, the top k, renormalised only when ``norm_topk_prob``.
Qwen2-MoE adds a gated shared expert to every MoE block.
"""
from __future__ import annotations

from torch import nn

from tamis.engine.layers.fused_moe import SparseMoeBlock
from tamis.engine.models.llama import LlamaMLP
from tamis.engine.models.qwen2 import Qwen2ForCausalLM
from tamis.engine.models.qwen3 import Qwen3ForCausalLM

QWEN_EXPERT_WEIGHT_NAMES = {"gate_proj": ("w13", 0), "up_proj": ("w13", 1),
                            "down_proj": ("w2", 0)}


def is_sparse_layer(config, layer_idx: int) -> bool:
    """transformers' rule: experts on every ``decoder_sparse_step``-th layer not listed
    in ``mlp_only_layers``."""
    step = getattr(config, "decoder_sparse_step", 1) or 1
    return (layer_idx not in (getattr(config, "mlp_only_layers", None) or [])
            and config.num_experts > 0 and (layer_idx + 1) % step == 0)


def qwen_moe_mlp(config, layer_idx: int, quant_config, prefix: str,
                 shared_expert: nn.Module | None = None) -> nn.Module:
    if not is_sparse_layer(config, layer_idx):
        return LlamaMLP(config, quant_config, prefix)
    return SparseMoeBlock(config.hidden_size, config.num_experts, config.num_experts_per_tok,
                          config.moe_intermediate_size, bool(config.norm_topk_prob),
                          quant_config, prefix, shared_expert)


class Qwen3MoeForCausalLM(Qwen3ForCausalLM):
    expert_weight_names = QWEN_EXPERT_WEIGHT_NAMES
    make_mlp = staticmethod(qwen_moe_mlp)


class Qwen2MoeForCausalLM(Qwen2ForCausalLM):
    expert_weight_names = QWEN_EXPERT_WEIGHT_NAMES

    @staticmethod
    def attention_options(config) -> dict:
        return {"qkv_bias": bool(getattr(config, "qkv_bias", True)), "o_bias": False}

    @staticmethod
    def make_mlp(config, layer_idx: int, quant_config, prefix: str) -> nn.Module:
        shared = None
        if is_sparse_layer(config, layer_idx):
            shared = LlamaMLP(config, quant_config, f"{prefix}.shared_expert",
                              config.shared_expert_intermediate_size)
        return qwen_moe_mlp(config, layer_idx, quant_config, prefix, shared)
