"""TP=2 (two gloo processes on the CPU) against TP=1 and transformers, float32: the same
greedy tokens, logprobs within TP_ATOL of TP=1's and within HF_ATOL of transformers'.
Phi-3 stores q/k/v and gate/up fused: each rank cuts its part out of every shard."""
from __future__ import annotations

import pytest
import torch

from tp_helpers import (HF_ATOL, TP_ATOL, greedy, make_engine, max_logprob_gap, run,
                        transformers_greedy, transformers_prompt_logprobs)

MAX_TOKENS = 8
PROMPTS = [list(range(300, 340)), list(range(1000, 1013)), [5, 17, 923, 40000, 12]]


@pytest.fixture(scope="module", params=["llama", "mistral", "qwen2", "qwen3", "phi3"])
def runs(request, tiny_checkpoint):
    """(checkpoint, TP=1 outputs, TP=2 outputs, TP=2 engine's rank-0 model)."""
    path = tiny_checkpoint(request.param)
    outputs = {}
    for size in (1, 2):
        engine = make_engine(path, size)
        try:
            outputs[size] = run(engine, PROMPTS, greedy(MAX_TOKENS))
        finally:
            engine.shutdown()
    return path, outputs[1], outputs[2], engine.runner.model


def test_rank_holds_half_of_each_layer(runs):
    *_, model = runs
    attention = model.model.layers[0].self_attn
    assert (attention.num_heads, attention.num_kv_heads) == (2, 1)   # of 4 and 2
    assert attention.o_proj.weight.shape == (64, 32)                  # K split: 64 / 2
    assert model.model.layers[0].mlp.gate_up_proj.weight.shape == (128, 64)   # 2 x 128 / 2
    assert model.model.embed_tokens.weight.shape == (49152 // 2, 64)


def test_tp2_greedy_tokens_equal_tp1_and_transformers(runs):
    path, tp1, tp2, _ = runs
    tokens = [out.outputs[0].token_ids for out in tp2]
    assert tokens == [out.outputs[0].token_ids for out in tp1]
    assert tokens == transformers_greedy(path, PROMPTS, MAX_TOKENS)


def test_tp2_logprobs_match_tp1(runs):
    _, tp1, tp2, _ = runs
    assert max_logprob_gap(tp1, tp2) <= TP_ATOL


def test_tp2_prompt_logprobs_match_transformers(runs):
    path, _, tp2, _ = runs
    reference = transformers_prompt_logprobs(path, PROMPTS[0])
    for position, ranked in enumerate(tp2[0].prompt_logprobs[1:]):
        for token, logprob in ranked.items():
            assert abs(logprob.logprob - reference[position, token].item()) <= HF_ATOL
