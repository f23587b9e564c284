"""The Llama-3.1-8B shape (config only, no weights) shared by the GPU benchmarks.

``write_llama8b_config(folder)`` writes a ``config.json`` that tamis loads with
``load_format="dummy"`` and transformers builds with random weights: 32 layers,
hidden 4096, 32 query / 8 KV heads, MLP 14336, vocabulary 128256, llama3 rope.
No tokenizer: the benchmarks feed token ids.
"""
from __future__ import annotations

import json
from pathlib import Path

LLAMA_31_8B = dict(
    architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=128256,
    hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
    num_key_value_heads=8, head_dim=128, hidden_act="silu", max_position_embeddings=131072,
    rms_norm_eps=1e-5, rope_theta=500000.0,
    rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                      original_max_position_embeddings=8192),
    attention_bias=False, mlp_bias=False, tie_word_embeddings=False, torch_dtype="bfloat16",
    bos_token_id=128000, eos_token_id=128001, initializer_range=0.02,
)


def write_llama8b_config(folder: str | Path, **overrides) -> Path:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({**LLAMA_31_8B, **overrides}, indent=1))
    return folder
