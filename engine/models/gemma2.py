"""Gemma 2: the Llama body with Gemma's changes.

- RMSNorm of ``(1 + w)`` in float32 (``GemmaRMSNorm``), after the attention and the MLP
  as well as before them;
- embeddings multiplied by sqrt(hidden_size); GeGLU MLP (``gelu_pytorch_tanh``);
- attention scaled by ``query_pre_attn_scalar ** -0.5``, its logits soft-capped at
  ``attn_logit_softcapping``; the final logits soft-capped at ``final_logit_softcapping``;
- sliding-window layers alternating with global ones (``config.layer_types``).

KV blocks: the sliding layers and the global ones form separate KV-cache groups, each
with its own block table (``engine/kv_groups.py``); the sliding groups release the blocks
that fall out of their window, the global group keeps every block.
"""
from __future__ import annotations

import torch

from tamis.engine.layers.layernorm import GemmaRMSNorm
from tamis.engine.models.base import layer_sliding_windows
from tamis.engine.models.llama import LlamaDecoderLayer, LlamaForCausalLM, LlamaMLP

_NORMS = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
          "post_feedforward_layernorm")


def geglu_mlp(config, layer_idx: int, quant_config, prefix: str) -> LlamaMLP:
    """The gated MLP with Gemma's activation (``hidden_activation``)."""
    act = getattr(config, "hidden_activation", None) or config.hidden_act
    return LlamaMLP(config, quant_config, prefix, hidden_act=act)


class Gemma2DecoderLayer(LlamaDecoderLayer):
    """``h += post_attn_norm(attn(input_norm(h)))``, then
    ``h += post_ff_norm(mlp(pre_ff_norm(h)))``; each residual add is fused into the
    next norm, as in LlamaDecoderLayer (the returned pair sums to h)."""

    def __init__(self, config, *args, **kwargs):
        super().__init__(config, *args, **kwargs)
        for name in _NORMS:
            setattr(self, name, GemmaRMSNorm(config.hidden_size, config.rms_norm_eps))

    def forward(self, positions, hidden, residual):
        if residual is None:
            residual, hidden = hidden, self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.post_attention_layernorm(self.self_attn(positions, hidden))
        hidden, residual = self.pre_feedforward_layernorm(hidden, residual)
        hidden = getattr(self, self.mlp_name)(hidden)
        return self.post_feedforward_layernorm(hidden), residual


class Gemma2ForCausalLM(LlamaForCausalLM):
    make_mlp = staticmethod(geglu_mlp)

    @staticmethod
    def attention_options(config) -> dict:
        bias = bool(getattr(config, "attention_bias", False))
        return {"qkv_bias": bias, "o_bias": bias, "qk_norm_cls": GemmaRMSNorm,
                "scale": config.query_pre_attn_scalar ** -0.5,
                "soft_cap": getattr(config, "attn_logit_softcapping", None)}

    @staticmethod
    def model_options(config) -> dict:
        return {"layer_cls": Gemma2DecoderLayer, "norm_cls": GemmaRMSNorm,
                "embed_scale": config.hidden_size ** 0.5}

    @staticmethod
    def sliding_windows(config) -> list[int | None]:
        return layer_sliding_windows(config)   # layer_types: sliding and full alternate

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """float32 logits, soft-capped: ``C * tanh(logits / C)``."""
        logits = super().compute_logits(hidden)
        cap = getattr(self.config, "final_logit_softcapping", None)
        return logits if cap is None else torch.tanh(logits / cap) * cap
