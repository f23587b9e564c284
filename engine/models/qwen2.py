"""Qwen2: the Llama decoder with biases on q/k/v (never on o_proj)."""
from __future__ import annotations

from tamis.engine.models.base import layer_sliding_windows
from tamis.engine.models.llama import LlamaForCausalLM


class Qwen2ForCausalLM(LlamaForCausalLM):

    @staticmethod
    def attention_options(config) -> dict:
        return {"qkv_bias": True, "o_bias": False}

    @staticmethod
    def sliding_windows(config) -> list[int | None]:
        return layer_sliding_windows(config)   # layer_types / use_sliding_window decide
