"""Engine features under TP=2 (two gloo processes, one engine shared by the module):
replicated KV heads, structured outputs, prefix caching and pipelined steps give what
TP=1 gives, and a mixture-of-experts model is refused."""
from __future__ import annotations

import json

import pytest
import torch

from tamis import SamplingParams, StructuredOutputsParams
from tp_helpers import greedy, make_engine, run

# One key/value head for two ranks: each rank keeps (a copy of) that head.
ONE_KV_HEAD = dict(num_key_value_heads=1)
PROMPT = list(range(300, 340))   # 40 tokens: two full blocks of 16 and a partial one
SCHEMA = {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]},
                                           "size": {"type": "integer"}},
          "required": ["color", "size"], "additionalProperties": False}


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoint):
    return tiny_checkpoint("llama", **ONE_KV_HEAD)


@pytest.fixture(scope="module")
def engines(checkpoint):
    """{1: TP=1 engine, 2: TP=2 engine} over the same checkpoint."""
    built = {size: make_engine(checkpoint, size) for size in (1, 2)}
    yield built
    for engine in built.values():
        engine.shutdown()


def test_one_kv_head_is_replicated_on_both_ranks(engines, checkpoint):
    from safetensors.torch import load_file

    attention = engines[2].runner.model.model.layers[0].self_attn
    assert (attention.num_heads, attention.num_kv_heads) == (2, 1)
    state = load_file(str(checkpoint / "model.safetensors"))
    _, k, _ = attention.qkv_proj.weight.split([32, 16, 16])
    k_proj = state["model.layers.0.self_attn.k_proj.weight"]
    assert torch.equal(k, k_proj)   # the whole (only) head
    assert engines[2].runner.kv_spec.num_kv_heads == 1


def test_greedy_tokens_equal_tp1(engines):
    prompts = [PROMPT, list(range(2000, 2017))]
    want = [out.outputs[0].token_ids for out in run(engines[1], prompts, greedy(10))]
    assert [out.outputs[0].token_ids for out in run(engines[2], prompts, greedy(10))] == want


def test_json_schema_output_equals_tp1(engines):
    params = SamplingParams(temperature=0.0, max_tokens=40,
                            structured_outputs=StructuredOutputsParams(json=SCHEMA))
    prompt = "Describe a ball as JSON:"
    texts = [run(engines[size], [prompt], params)[0].outputs[0] for size in (1, 2)]
    assert texts[0].text == texts[1].text
    assert texts[1].finish_reason == "stop"
    value = json.loads(texts[1].text)
    assert value["color"] in ("red", "green", "blue") and isinstance(value["size"], int)


def test_prefix_cache_hit_gives_the_same_tokens(engines):
    params = greedy(6, logprobs=None)
    first = run(engines[2], [PROMPT], params)[0]
    second = run(engines[2], [PROMPT], params)[0]
    assert second.num_cached_tokens >= 32   # the two full blocks
    assert second.outputs[0].token_ids == first.outputs[0].token_ids
    assert first.outputs[0].token_ids == run(engines[1], [PROMPT], params)[0].outputs[0].token_ids


def test_pipelined_steps_broadcast_in_flight_ids(engines):
    """With async scheduling a step's input ids come from the previous step's sampled ids
    on rank 0's device; the other rank receives them by broadcast."""
    prompts = [PROMPT, list(range(3000, 3009))]
    params = greedy(8, logprobs=None)
    want = [out.outputs[0].token_ids for out in run(engines[1], prompts, params)]
    workers, sent = engines[2].runner.workers, []
    send = workers.send
    workers.send = lambda command: (sent.append(command), send(command))
    engines[2].async_scheduling = True
    try:
        got = [out.outputs[0].token_ids for out in run(engines[2], prompts, params)]
    finally:
        engines[2].async_scheduling = False
        del workers.send
    assert got == want
    assert any(command[0] == "step" and command[1].has_inflight for command in sent)


def test_mixture_of_experts_is_refused(tiny_checkpoint):
    with pytest.raises(ValueError, match="mixture of experts"):
        make_engine(tiny_checkpoint("mixtral"), 2)


def test_llm_shutdown_stops_the_ranks_and_aborts_what_is_unfinished(checkpoint):
    from tamis import LLM

    with LLM(str(checkpoint), dtype="float32", kv_cache_memory_bytes="32MiB",
             max_model_len=256, tensor_parallel_size=2, device="cpu") as llm:
        engine = llm.llm_engine
        ranks = list(engine.runner.workers.processes.values())
        assert ranks and all(rank.is_alive() for rank in ranks)
        assert llm.generate([PROMPT], greedy(4), use_tqdm=False)[0].outputs[0].token_ids
        engine.add_request("left", PROMPT, greedy(64))
        engine.step()
        used = engine.kv_cache.num_free_blocks
    assert not engine.has_unfinished_requests()
    assert engine.kv_cache.num_free_blocks > used   # the aborted request's blocks came back
    assert all(not rank.is_alive() for rank in ranks)
    llm.shutdown()   # idempotent
    with pytest.raises(RuntimeError, match="shut down"):
        llm.generate([PROMPT], greedy(4), use_tqdm=False)
