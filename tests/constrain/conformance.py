"""Shared helpers for the model-free conformance tests and bench/bench_structured.py:
where the external data lives, the SmolLM2 tokenizer info, and the token walk."""
from __future__ import annotations

import json
import random
from functools import lru_cache
from pathlib import Path

import numpy as np

CONFORMANCE = Path(__file__).resolve().parents[2] / ".." / "shared" / "conformance"
SUITE = CONFORMANCE / "json-schema-test-suite" / "tests" / "draft2020-12"
MASKBENCH = CONFORMANCE / "maskbench-dev"


@lru_cache(maxsize=1)
def smollm2():
    """(tokenizer, TokenizerInfo) of the embedded SmolLM2 model."""
    from transformers import AutoTokenizer

    from tamis.constrain import TokenizerInfo
    from tamis.engine.embedded import default_model_path
    tokenizer = AutoTokenizer.from_pretrained(default_model_path())
    return tokenizer, TokenizerInfo.from_hf(tokenizer)


def compact(data) -> str:
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


def walk(compiled, text: str, check_mask: bool = False) -> tuple[bool, int]:
    """Feeds ``text`` token by token, then EOS. Returns (accepted, tokens outside the mask)."""
    tokenizer, info = smollm2()
    matcher = compiled.matcher()
    bitmask = np.zeros((1, info.num_words), dtype=np.int32) if check_mask else None
    outside = 0
    for token in tokenizer.encode(text, add_special_tokens=False) + [info.eos_token_ids[0]]:
        if check_mask:
            matcher.fill_bitmask(bitmask, 0)
            outside += not (bitmask[0, token // 32] >> (token % 32)) & 1
        if not matcher.accept(token):
            return False, outside
    return True, outside


def maskbench_sample(per_subset: int = 40, seed: int = 0) -> list[tuple[str, Path]]:
    """BENCHMARKS.md's sample: up to ``per_subset`` files per subset, sorted then shuffled."""
    out = []
    for subset in sorted(p for p in MASKBENCH.iterdir() if p.is_dir()):
        files = sorted(subset.glob("*.json"))
        random.Random(seed).shuffle(files)
        out += [(subset.name, f) for f in files[:per_subset]]
    return out
