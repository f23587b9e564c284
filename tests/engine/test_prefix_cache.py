"""Prefix caching through the engine: hits are counted and never change the output."""
from __future__ import annotations

import random

from engine_helpers import make_engine, run_to_completion
from tamis.engine.sampling_params import SamplingParams

PARAMS = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


def _shared_prefix_prompts() -> list[list[int]]:
    rng = random.Random(11)
    prefix = [rng.randrange(100, 49152) for _ in range(100)]
    return [prefix + [rng.randrange(100, 49152) for _ in range(n)] for n in (5, 20, 1)]


def test_second_request_hits_the_cache_with_same_output(tiny_checkpoint):
    path = tiny_checkpoint("mistral")   # sliding window 32 < the 100-token shared prefix
    first, second, third = _shared_prefix_prompts()
    engine = make_engine(path)
    run_to_completion(engine, [first], PARAMS, prefix="a")
    before = engine.get_stats()
    out = run_to_completion(engine, [second], PARAMS, prefix="b")[0]
    after = engine.get_stats()
    assert out.num_cached_tokens == 96                        # 6 full blocks of the 100-token prefix
    assert after.prefix_cache_hits - before.prefix_cache_hits == 96
    assert after.prefix_cache_queries - before.prefix_cache_queries == len(second)

    cold = make_engine(path, enable_prefix_caching=False)
    outputs_off = run_to_completion(cold, [first, second, third], PARAMS)
    warm = make_engine(path)
    outputs_on = [run_to_completion(warm, [p], PARAMS, prefix=f"w{i}")[0]
                  for i, p in enumerate([first, second, third])]
    assert [o.outputs[0].token_ids for o in outputs_on] == [o.outputs[0].token_ids for o in outputs_off]
    assert out.outputs[0].token_ids == outputs_off[1].outputs[0].token_ids
    assert cold.get_stats().prefix_cache_hits == 0 and warm.get_stats().prefix_cache_hits > 0


def test_identical_prompt_leaves_one_token_to_compute(tiny_checkpoint):
    engine = make_engine(tiny_checkpoint("llama"))
    prompt = list(range(1000, 1032))                          # exactly two blocks
    a = run_to_completion(engine, [prompt], PARAMS, prefix="a")[0]
    b = run_to_completion(engine, [prompt], PARAMS, prefix="b")[0]
    assert b.num_cached_tokens == 16                          # the last block is recomputed for logits
    assert a.outputs[0].token_ids == b.outputs[0].token_ids


def test_prompt_logprobs_bypass_the_cache(tiny_checkpoint):
    engine = make_engine(tiny_checkpoint("llama"))
    prompt = list(range(2000, 2040))
    run_to_completion(engine, [prompt], PARAMS, prefix="a")
    with_logprobs = SamplingParams(temperature=0.0, max_tokens=2, prompt_logprobs=0)
    out = run_to_completion(engine, [prompt], with_logprobs, prefix="b")[0]
    assert out.num_cached_tokens == 0
    assert len(out.prompt_logprobs) == len(prompt) and all(e for e in out.prompt_logprobs[1:])


def test_llm_reset_prefix_cache_makes_the_same_prompt_miss(tiny_checkpoint):
    from tamis.engine.llm import LLM
    llm = LLM(model=str(tiny_checkpoint("llama")), skip_tokenizer_init=True, max_model_len=256)
    prompt = {"prompt_token_ids": list(range(1000, 1032))}    # exactly two blocks
    llm.generate(prompt, PARAMS)
    assert llm.generate(prompt, PARAMS)[0].num_cached_tokens == 16
    assert llm.reset_prefix_cache()
    assert llm.generate(prompt, PARAMS)[0].num_cached_tokens == 0
