"""Qwen2: the Llama decoder with biases on q/k/v (never on o_proj)."""
from __future__ import annotations

from tamis.engine.models.llama import LlamaForCausalLM


class Qwen2ForCausalLM(LlamaForCausalLM):

    @staticmethod
    def attention_options(config) -> dict:
        return {"qkv_bias": True, "o_bias": False}
