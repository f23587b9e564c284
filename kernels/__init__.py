"""tamis.kernels: each op is a plain-torch reference, a Triton kernel and one dispatcher.

``tamis.kernels.<module>`` holds ``<op>_ref`` (plain torch, any device), ``<op>_triton``
(the Triton kernel: compiled for CUDA tensors, interpreted for CPU tensors) and ``<op>``
(the dispatcher: Triton on CUDA, the reference elsewhere). The dispatchers are
re-exported here, imported on first use so ``import tamis.kernels`` stays cheap.

=====================  ==========================  =========================================
module                 dispatcher                  what
=====================  ==========================  =========================================
bitmask                apply_token_bitmask_        constraint bitmask -> -inf logits, in place
cache                  store_kv_cache              K/V of new tokens into paged blocks
norm                   rms_norm, fused_add_rms_norm
rotary                 rotary_embedding_           neox-style rotary on q and k, in place
activation             silu_and_mul
attention_prefill      paged_attention_prefill     varlen chunks over cached prefix, causal
attention_decode       paged_attention_decode      one query per sequence, split-K
gemv                   linear                      F.linear; one bf16/fp16 row: split-K GEMV
=====================  ==========================  =========================================
"""
from __future__ import annotations

import importlib

if __name__ == "kernels":  # run as the bare name: another package may own it
    from tamis._shadowed import hand_name_to_installed
    hand_name_to_installed(__name__, __file__)

_HOME = {
    "apply_token_bitmask_": "bitmask", "apply_token_bitmask_ref": "bitmask",
    "store_kv_cache": "cache", "store_kv_cache_ref": "cache",
    "rms_norm": "norm", "rms_norm_ref": "norm",
    "fused_add_rms_norm": "norm", "fused_add_rms_norm_ref": "norm",
    "rotary_embedding_": "rotary", "rotary_embedding_ref": "rotary",
    "silu_and_mul": "activation", "silu_and_mul_ref": "activation",
    "paged_attention_prefill": "attention_prefill",
    "paged_attention_prefill_ref": "attention_prefill",
    "paged_attention_decode": "attention_decode",
    "paged_attention_decode_ref": "attention_decode",
    "linear": "gemv",
}

__all__ = sorted(_HOME)


def __getattr__(name: str):
    if name not in _HOME:
        raise AttributeError(f"module 'tamis.kernels' has no attribute {name!r}")
    module = importlib.import_module(f"tamis.kernels.{_HOME[name]}")
    return getattr(module, name)
