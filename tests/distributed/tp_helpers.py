"""Running a tiny checkpoint at several tensor-parallel sizes and comparing the results."""
from __future__ import annotations

import torch

from tamis import SamplingParams
from tamis.engine.engine import LLMEngine

# fp32 all-reduce order: a row-parallel layer sums two half-K dot products instead of one
# K-long one. Measured on the tiny checkpoints: logprob differences up to ~2e-6 between
# TP=1 and TP=2 (logits of magnitude ~10); 1e-5 leaves room without hiding a wrong shard.
TP_ATOL = 1e-5
HF_ATOL = 1e-4   # tamis against transformers, as tests/engine/test_models.py


def make_engine(model, tensor_parallel_size: int, **engine_args) -> LLMEngine:
    """An engine on the CPU (gloo between ranks) unless ``device`` says otherwise."""
    args = dict(model=str(model), dtype="float32", kv_cache_memory_bytes="32MiB",
                max_model_len=256, max_num_seqs=8, tensor_parallel_size=tensor_parallel_size,
                device="cpu")
    return LLMEngine(**{**args, **engine_args})


def greedy(max_tokens: int = 8, logprobs: int | None = 5, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True,
                          logprobs=logprobs, prompt_logprobs=logprobs, **kw)


def run(engine: LLMEngine, prompts: list, params: SamplingParams) -> list:
    """Each prompt's finished RequestOutput, all prompts batched in one engine."""
    for index, prompt in enumerate(prompts):
        engine.add_request(f"r{index}", prompt if isinstance(prompt, str)
                           else {"prompt_token_ids": prompt}, params)
    finished = {}
    while engine.has_unfinished_requests():
        finished.update({out.request_id: out for out in engine.step() if out.finished})
    return [finished[f"r{index}"] for index in range(len(prompts))]


def max_logprob_gap(a: list, b: list) -> float:
    """The largest difference between two runs' logprobs of the same tokens (sampled and
    prompt positions); AssertionError when they rank the tokens differently."""
    gap = 0.0
    for out_a, out_b in zip(a, b):
        positions = list(zip(out_a.outputs[0].logprobs, out_b.outputs[0].logprobs))
        positions += [(x, y) for x, y in zip(out_a.prompt_logprobs, out_b.prompt_logprobs)
                      if x is not None]
        for x, y in positions:
            assert x.keys() == y.keys()
            gap = max(gap, max(abs(x[t].logprob - y[t].logprob) for t in x))
    return gap


@torch.no_grad()
def transformers_greedy(model_dir, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tokens = []
    for prompt in prompts:
        ids = torch.tensor([prompt])
        out = reference.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=max_tokens, min_new_tokens=max_tokens,
                                 pad_token_id=0)
        tokens.append(out[0, len(prompt):].tolist())
    return tokens


@torch.no_grad()
def transformers_prompt_logprobs(model_dir, prompt: list[int]) -> torch.Tensor:
    """log_softmax of transformers' logits at each prompt position: [len - 1, V] scoring
    tokens 1.. of the prompt."""
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    logits = reference(torch.tensor([prompt])).logits[0].float()
    return torch.log_softmax(logits, dim=-1)[:-1]
