"""The Llama-3.1-8B shape (config only, no weights) shared by the GPU benchmarks.

``write_llama8b_config(folder)`` writes a ``config.json`` that tamis loads with
``load_format="dummy"`` and transformers builds with random weights: 32 layers,
hidden 4096, 32 query / 8 KV heads, MLP 14336, vocabulary 128256, llama3 rope.
No tokenizer: the benchmarks feed token ids. ``make_prompts`` draws them and
``add_w1_workload_args`` gives W1's workload flags, shared by the benchmarks that run it.
"""
from __future__ import annotations

import json
import random
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


def make_prompts(num: int, lo: int, hi: int, seed: int, vocab: int = 128000,
                 first_id: int = 0) -> list[list[int]]:
    """``num`` prompts of ``lo``..``hi`` random token ids in [first_id, vocab), reproducible
    from ``seed``."""
    rng = random.Random(seed)
    return [[rng.randrange(first_id, vocab) for _ in range(rng.randint(lo, hi))]
            for _ in range(num)]


def add_w1_workload_args(parser) -> None:
    """W1's workload (bench/RESULTS.md): 256 requests, prompts of 128-1024 ids, 256 tokens out."""
    parser.add_argument("--num-prompts", type=int, default=256)
    parser.add_argument("--min-prompt", type=int, default=128)
    parser.add_argument("--max-prompt", type=int, default=1024)
    parser.add_argument("--output-len", type=int, default=256)
