"""The Llama-3.1-8B shape and W1's workload, shared by the GPU benchmarks.

``write_llama8b_config(folder)`` writes the Llama-3.1-8B ``config.json`` (bench/shapes.py
holds it beside the mixture-of-experts shapes): 32 layers, hidden 4096, 32 query / 8 KV
heads, MLP 14336, vocabulary 128256, llama3 rope. No tokenizer: the benchmarks feed token
ids. ``make_prompts`` draws them and ``add_w1_workload_args`` gives W1's workload flags,
shared by the benchmarks that run it.
"""
from __future__ import annotations

import random
from pathlib import Path

from shapes import LLAMA_31_8B, write_shape_config  # noqa: F401  (bench/ is on sys.path)


def write_llama8b_config(folder: str | Path, **overrides) -> Path:
    return write_shape_config("llama-3.1-8b", folder, **overrides)


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
