"""GPTQ act-order without a gather per layer: the producer writes its output sorted.

An act-order layer's weight rows are sorted by group once at load (``wna16_perm``), so
its GPU kernel reads ``x[..., perm]``: a gather kernel before every such linear. Where a
layer's input comes from exactly one producer that can write any column order (an
RMSNorm, SiLU-and-mul), the producer is told to write ``y[..., perm]`` instead and the
layer stops gathering. In the Llama decoder (Llama, Mistral, Qwen2, Qwen3, Phi-3 and
the dense layers of Qwen MoE models)::

    input_layernorm           -> self_attn.qkv_proj
    post_attention_layernorm  -> mlp.gate_up_proj
    mlp.act_fn                -> mlp.down_proj

o_proj keeps its gather: its input is the attention output, which no backend writes
permuted. Anything else keeps its gather too: other decoder layers (Gemma's extra norms),
MoE blocks, a producer without ``permute_output``, a row-parallel layer that all-gathers
its input under tensor parallelism (``input_rows``), or a layer whose kernel reads x in
the checkpoint's order anyway (the CPU reference). Values are unchanged: the producers
scatter their stores, so every number is computed as before.
"""
from __future__ import annotations

import logging

from torch import nn

from tamis.engine.models.llama import LlamaAttention, LlamaDecoderLayer, LlamaMLP
from tamis.quant.wna16 import expect_permuted_input, gathered_input_perm

logger = logging.getLogger(__name__)


def fuse_act_order_permutations(model: nn.Module) -> int:
    """Hands each act-order consumer's permutation to its single producer, in every
    Llama decoder layer of ``model`` (call once, after the weights are processed).
    Returns how many gathers were removed."""
    fused = 0
    for layer in model.modules():
        if type(layer) is LlamaDecoderLayer:
            fused += sum(fuse_pair(producer, consumer)
                         for producer, consumer in producer_consumer_pairs(layer))
    if fused:
        logger.info("act-order: %d input gathers fused into their producers", fused)
    return fused


def producer_consumer_pairs(layer: LlamaDecoderLayer) -> list[tuple[nn.Module, nn.Module]]:
    """The (producer, consumer) pairs of one decoder layer whose consumer reads nothing
    but the producer's output; exact types only, so a subclass that reroutes its forward
    pass is never assumed to keep these edges."""
    pairs = []
    if type(layer.self_attn) is LlamaAttention:
        pairs.append((layer.input_layernorm, layer.self_attn.qkv_proj))
    mlp = getattr(layer, layer.mlp_name)
    if type(mlp) is LlamaMLP:
        pairs += [(layer.post_attention_layernorm, mlp.gate_up_proj),
                  (mlp.act_fn, mlp.down_proj)]
    return pairs


def fuse_pair(producer: nn.Module, consumer: nn.Module) -> bool:
    """Moves the consumer's input gather into the producer when that is exact; True if so."""
    perm = gathered_input_perm(consumer)
    if perm is None or not hasattr(producer, "permute_output"):
        return False
    if getattr(consumer, "input_rows", None) is not None:
        return False   # tensor parallel: x is all-gathered from the ranks, then picked
    if perm.numel() != getattr(consumer, "input_size", perm.numel()):
        return False
    producer.permute_output(perm)
    expect_permuted_input(consumer)
    return True
