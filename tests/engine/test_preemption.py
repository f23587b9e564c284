"""Batch invariance and recompute preemption: outputs never depend on company or memory."""
from __future__ import annotations

import random

from engine_helpers import make_engine, run_to_completion
from tamis.engine.sampling_params import SamplingParams

PARAMS = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


def _mixed_prompts(count: int = 32, seed: int = 7) -> list[list[int]]:
    rng = random.Random(seed)
    lengths = [rng.choice([1, 3, 9, 16, 17, 33, 60, 95]) for _ in range(count)]
    return [[rng.randrange(100, 49152) for _ in range(n)] for n in lengths]


def _alone(engine, prompts) -> list[list[int]]:
    return [run_to_completion(engine, [p], PARAMS, prefix=f"alone{i}-")[0].outputs[0].token_ids
            for i, p in enumerate(prompts)]


def test_batch_invariance_and_preemption(tiny_checkpoint):
    path = tiny_checkpoint("llama")
    prompts = _mixed_prompts()
    alone = _alone(make_engine(path), prompts)

    together = run_to_completion(make_engine(path), prompts, PARAMS)
    assert [o.outputs[0].token_ids for o in together] == alone

    # 12 blocks of 16 tokens cannot hold 32 requests of up to 103 tokens: preemption must
    # happen, and recomputing must give the same tokens.
    small = make_engine(path, num_gpu_blocks_override=12, max_model_len=160, max_num_seqs=32)
    squeezed = run_to_completion(small, prompts, PARAMS)
    stats = small.get_stats()
    assert stats.num_preemptions > 0
    assert [o.outputs[0].token_ids for o in squeezed] == alone
    assert stats.num_free_blocks == stats.num_total_blocks == 12
    assert all(block.ref_cnt == 0 for block in small.kv_cache.pool.blocks)
    assert not small.scheduler.running and not small.scheduler.waiting


def test_preemption_without_prefix_cache_and_chunked(tiny_checkpoint):
    path = tiny_checkpoint("qwen3")
    prompts = _mixed_prompts(count=10, seed=8)
    alone = _alone(make_engine(path), prompts)
    small = make_engine(path, num_gpu_blocks_override=10, max_model_len=160, max_num_seqs=10,
                        max_num_batched_tokens=24, enable_prefix_caching=False)
    outputs = run_to_completion(small, prompts, PARAMS)
    assert small.get_stats().num_preemptions > 0
    assert [o.outputs[0].token_ids for o in outputs] == alone
    assert small.kv_cache.num_free_blocks == 10


def test_priority_preempts_the_low_priority_request(tiny_checkpoint):
    engine = make_engine(tiny_checkpoint("llama"), num_gpu_blocks_override=6, max_model_len=96,
                         scheduling_policy="priority")
    long_params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    engine.add_request("low", list(range(100, 140)), long_params, priority=5)
    engine.add_request("high", list(range(200, 240)), long_params, priority=0)
    finished = []
    while engine.has_unfinished_requests():
        finished += [o.request_id for o in engine.step() if o.finished]
    assert finished == ["high", "low"]
    assert engine.get_stats().num_preemptions > 0
