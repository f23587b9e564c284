"""Phi-3 / Phi-3.5: the Llama decoder, whose checkpoints store q/k/v and gate/up already
fused (``qkv_proj``, ``gate_up_proj``, loaded whole into the fused layers), with LongRoPE
scaling (``layers/rotary.py``) and, where the config sets ``sliding_window``, a window
on every layer (as transformers' Phi-3 masks)."""
from __future__ import annotations

from tamis.engine.models.base import layer_sliding_windows
from tamis.engine.models.llama import LlamaForCausalLM


class Phi3ForCausalLM(LlamaForCausalLM):
    packed_modules_mapping: dict[str, list[str]] = {}   # the checkpoint's names are the fused ones

    @staticmethod
    def sliding_windows(config) -> list[int | None]:
        return layer_sliding_windows(config)
