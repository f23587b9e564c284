"""Mixtral: Mistral's decoder with a sparse MoE block (``block_sparse_moe``) in place of
the MLP. Routing: softmax over the top-k router logits."""
from __future__ import annotations

from tamis.engine.layers.fused_moe import SparseMoeBlock
from tamis.engine.models.llama import MistralForCausalLM


class MixtralForCausalLM(MistralForCausalLM):
    mlp_name = "block_sparse_moe"
    expert_weight_names = {"w1": ("w13", 0), "w3": ("w13", 1),
                           "w2": ("w2", 0)}
    # llm-compressor saves the per-expert linears it splits from transformers 5's fused
    # experts under these names.
    expert_weight_aliases = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}

    @staticmethod
    def make_mlp(config, layer_idx: int, quant_config, prefix: str) -> SparseMoeBlock:
        return SparseMoeBlock(config.hidden_size, config.num_local_experts,
                              config.num_experts_per_tok, config.intermediate_size,
                              renormalize=True, quant_config=quant_config, prefix=prefix)
