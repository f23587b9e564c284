"""Qwen3: the Llama decoder with per-head RMSNorm on q and k before rotary."""
from __future__ import annotations

from tamis.engine.models.base import layer_sliding_windows
from tamis.engine.models.llama import LlamaForCausalLM


class Qwen3ForCausalLM(LlamaForCausalLM):

    @staticmethod
    def attention_options(config) -> dict:
        bias = bool(getattr(config, "attention_bias", False))
        return {"qkv_bias": bias, "o_bias": bias, "qk_norm": True}

    @staticmethod
    def sliding_windows(config) -> list[int | None]:
        return layer_sliding_windows(config)   # layer_types / use_sliding_window decide
