"""Shared helpers for the engine-core tests (not a test module)."""
from __future__ import annotations

import random
from functools import lru_cache

import torch

torch.set_num_threads(2)

TINY_ARCHS = ("llama", "mistral", "qwen2", "qwen3")
# Mixed lengths 1..310: several cross 16-token blocks, two cross Mistral's 32-token window.
PROMPT_LENGTHS = (1, 5, 16, 17, 40, 100, 210, 310)


def random_prompts(lengths=PROMPT_LENGTHS, seed: int = 0, vocab: int = 49152) -> list[list[int]]:
    rng = random.Random(seed)
    # Ids from the ordinary part of the vocabulary (clear of SmolLM2's special tokens).
    return [[rng.randrange(100, vocab) for _ in range(n)] for n in lengths]


def make_engine(path, **engine_args):
    from tamis.engine.engine import LLMEngine
    engine_args.setdefault("kv_cache_memory_bytes", "64MiB")
    return LLMEngine(model=str(path), **engine_args)


def run_to_completion(engine, prompts, params, prefix: str = "r") -> list:
    """Adds every prompt (one params or one per prompt), steps until done, returns the
    final RequestOutputs in input order."""
    params = params if isinstance(params, list) else [params] * len(prompts)
    ids = [f"{prefix}{i}" for i in range(len(prompts))]
    for request_id, prompt, sp in zip(ids, prompts, params):
        engine.add_request(request_id, prompt, sp)
    final = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                final[output.request_id] = output
    return [final[i] for i in ids]


@lru_cache(maxsize=4)
def hf_model(path: str):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def hf_greedy(path, prompt: list[int], max_new_tokens: int) -> list[int]:
    """transformers' greedy continuation of one prompt, EOS ignored."""
    model = hf_model(str(path))
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                             min_new_tokens=max_new_tokens, do_sample=False, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def hf_prompt_logprobs(path, prompt: list[int]) -> torch.Tensor:
    """log p(prompt[i+1] | prompt[:i+1]) for every i, from transformers."""
    model = hf_model(str(path))
    with torch.no_grad():
        logits = model(torch.tensor([prompt])).logits[0].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    return logprobs[:-1].gather(1, torch.tensor(prompt[1:])[:, None])[:, 0]
