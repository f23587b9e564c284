"""Gemma 3 text models (``Gemma3ForCausalLM``): Gemma 2 plus per-head q/k RMSNorm
(Gemma's ``(1 + w)`` kind) before rotary, and a rope of its own for the sliding layers
(``rope_parameters["sliding_attention"]``, ``rope_local_base_freq`` in older configs).
Its layer pattern (5 sliding : 1 global by default) comes from ``config.layer_types``;
soft-caps apply only where the config sets them (Gemma 3's leave them unset)."""
from __future__ import annotations

from tamis.engine.models.gemma2 import Gemma2ForCausalLM


class Gemma3ForCausalLM(Gemma2ForCausalLM):

    @staticmethod
    def attention_options(config) -> dict:
        return {**Gemma2ForCausalLM.attention_options(config), "qk_norm": True}

    @staticmethod
    def model_options(config) -> dict:
        layer_types = list(config.layer_types[:config.num_hidden_layers])
        return {**Gemma2ForCausalLM.model_options(config), "rope_layer_types": layer_types}
