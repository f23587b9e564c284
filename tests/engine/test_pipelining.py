"""Pipelined steps (engine/inflight.py): the same outputs as one step at a time.

Every test runs the same requests through an engine with ``async_scheduling`` off and
on, on CPU, and compares everything a caller sees. On CPU nothing is asynchronous,
but the pipelined bookkeeping (tokens in flight, input ids taken from the previous
step's sampled ids, dropped tokens of requests that stopped a step late) is the same
code that runs on CUDA.
"""
from __future__ import annotations

import random

import pytest

from engine_helpers import make_engine, random_prompts, run_to_completion
from tamis.constrain import StructuredOutputsParams
from tamis.engine.inflight import is_pipelinable
from tamis.engine.sampling_params import SamplingParams


def _outputs(path, prompts, params, pipelined: bool, gpu_runner: bool = False, **engine_args):
    engine = _engine(path, pipelined, gpu_runner, **engine_args)
    outputs = run_to_completion(engine, prompts, params)
    _assert_clean(engine)
    return outputs, engine


def _engine(path, pipelined: bool, gpu_runner: bool, **engine_args):
    from tamis.engine import engine as engine_module
    from tamis.engine.gpu_runner import GPUModelRunner
    saved = engine_module.make_runner
    if gpu_runner:   # the numpy layout + step buffers path that CUDA runs, here on CPU
        engine_module.make_runner = GPUModelRunner
    try:
        engine = make_engine(path, **engine_args)
    finally:
        engine_module.make_runner = saved
    engine.async_scheduling = pipelined
    return engine


def _assert_clean(engine) -> None:
    """Every block back in the pool, no token left counted in flight."""
    engine.step()   # reads a last pipelined step whose requests all finished, if any
    assert engine._inflight is None
    assert engine.kv_cache.num_free_blocks == engine.kv_cache.num_blocks
    assert not engine.scheduler.running and not engine.scheduler.waiting


def _visible(output) -> list:
    """What a caller sees of one RequestOutput, logprob values aside (``_floats``): a
    different batch shape may change their last bits."""
    seqs = []
    for c in output.outputs:
        logprobs = None if c.logprobs is None else [
            {t: lp.rank for t, lp in entry.items()} for entry in c.logprobs]
        seqs.append((c.index, c.token_ids, c.text, c.finish_reason, c.stop_reason, logprobs))
    return [output.request_id, output.finished, seqs]


def _floats(outputs) -> list[float]:
    """Every logprob value a caller sees, in a fixed order."""
    values = []
    for output in outputs:
        for c in output.outputs:
            values += [c.cumulative_logprob or 0.0]
            values += [lp.logprob for entry in c.logprobs or () for lp in entry.values()]
    return values


def _assert_same(got, want) -> None:
    assert [_visible(o) for o in got] == [_visible(o) for o in want]
    assert _floats(got) == pytest.approx(_floats(want), abs=1e-4)


def _mixed_params(rng: random.Random, stop: str | None, eos: int) -> list[SamplingParams]:
    """One SamplingParams per prompt: greedy and seeded sampling, several lengths,
    logprobs, n > 1, a stop string, min_tokens holding back an EOS that logit_bias
    pushes, and requests that are never pipelined (penalties, a grammar) in the same
    batches."""
    choices = [
        SamplingParams(temperature=0.0, max_tokens=rng.randint(1, 24), ignore_eos=True),
        SamplingParams(temperature=0.9, top_p=0.9, seed=rng.randint(0, 99), max_tokens=20),
        SamplingParams(temperature=0.0, max_tokens=12, logprobs=2),
        SamplingParams(temperature=1.0, seed=7, n=2, max_tokens=10),
        SamplingParams(temperature=0.0, max_tokens=30, stop=[stop] if stop else None),
        SamplingParams(temperature=0.0, max_tokens=16, repetition_penalty=1.3),
        SamplingParams(temperature=0.0, max_tokens=16, min_tokens=5, ignore_eos=False),
        SamplingParams(temperature=0.0, max_tokens=9, stop_token_ids=[rng.randrange(100, 49152)]),
        SamplingParams(temperature=0.0, max_tokens=10,
                       structured_outputs=StructuredOutputsParams(choice=["yes", "no"])),
        SamplingParams(temperature=0.0, max_tokens=12, min_tokens=4, logit_bias={eos: 100.0}),
    ]
    return choices


def _stop_string(path, prompt) -> str:
    """Two characters from the middle of a greedy output, so a stop string really hits."""
    engine = make_engine(path)
    text = run_to_completion(engine, [prompt], SamplingParams(temperature=0.0, max_tokens=30,
                                                              ignore_eos=True))[0].outputs[0].text
    assert len(text) > 8, text
    middle = len(text) // 2
    return text[middle:middle + 2]


@pytest.mark.parametrize("gpu_runner", [False, True])
def test_pipelined_outputs_equal_sequential(tiny_checkpoint, gpu_runner):
    path = tiny_checkpoint("llama")
    prompts = random_prompts(lengths=(1, 5, 16, 17, 40, 100, 33, 64, 7, 12), seed=3)
    eos = make_engine(path).tokenizer.eos_token_id
    params = _mixed_params(random.Random(3), _stop_string(path, prompts[4]), eos)
    assert is_pipelinable(params[9])
    want, _ = _outputs(path, prompts, params, pipelined=False, gpu_runner=gpu_runner)
    got, engine = _outputs(path, prompts, params, pipelined=True, gpu_runner=gpu_runner)
    _assert_same(got, want)
    assert want[4].outputs[0].finish_reason == "stop", "the stop string must end request 4"
    assert want[8].outputs[0].text in ("yes", "no"), "the grammar must hold"
    held = want[9].outputs[0].token_ids
    assert len(held) == 5 and held[-1] == eos and eos not in held[:4], "min_tokens must hold EOS"
    assert engine.get_stats().num_generation_tokens == _num_tokens(want)


@pytest.mark.parametrize("constrained", [False, True])
def test_min_tokens_counts_the_tokens_in_flight(tiny_checkpoint, constrained):
    """min_tokens rows keep the pipelined schedule: the stop ids stay masked for exactly
    min_tokens tokens, counting the one in flight, on the plain path (sampled at launch)
    and, with a constrained row in the batch, the constrained one (every row sampled
    once the previous step's tokens are appended)."""
    path = tiny_checkpoint("llama")
    eos = make_engine(path).tokenizer.eos_token_id
    push_eos = {eos: 100.0}
    params = [SamplingParams(temperature=0.0, max_tokens=12, min_tokens=4, logit_bias=push_eos),
              SamplingParams(temperature=0.0, max_tokens=12, min_tokens=7, logit_bias=push_eos),
              SamplingParams(temperature=0.0, max_tokens=12, min_tokens=6, logit_bias=push_eos,
                             structured_outputs=StructuredOutputsParams(regex="[a-z ]{1,40}"))]
    params = params if constrained else params[:2]
    assert all(is_pipelinable(p) for p in params)
    prompts = random_prompts(lengths=(6, 11, 9)[:len(params)], seed=5)
    want, _ = _outputs(path, prompts, params, pipelined=False)
    got, _ = _outputs(path, prompts, params, pipelined=True)
    _assert_same(got, want)
    for output, p in zip(got, params):
        ids = output.outputs[0].token_ids
        assert len(ids) == p.min_tokens + 1 and ids[-1] == eos and eos not in ids[:-1], ids


def test_pipelined_grammars_with_row_workers_equal_sequential(tiny_checkpoint):
    """Constrained requests keep the pipelined schedule (masks filled after the previous
    step's tokens are accepted); mask rows built in worker processes change nothing."""
    path = tiny_checkpoint("llama")
    prompts = random_prompts(lengths=(3, 9, 14, 22, 5, 30, 11, 8), seed=4)
    schema = {"type": "object", "properties": {"n": {"type": "integer"}, "s": {
        "type": "string", "maxLength": 6}}, "required": ["n", "s"], "additionalProperties": False}
    tags = {"type": "array", "uniqueItems": True, "items": {"type": "string"}, "maxItems": 4}
    specs = [dict(json=schema), dict(regex=r"([a-z]{2,5} ){4}"), dict(choice=["alpha", "beta"]),
             dict(json=tags)]                                 # a wrapper matcher (unique_items)
    params = [SamplingParams(temperature=1.0, seed=i, max_tokens=24,
                             structured_outputs=StructuredOutputsParams(**specs[i % 4]))
              for i in range(len(prompts))]
    want, _ = _outputs(path, prompts, params, pipelined=False)
    engine = _engine(path, pipelined=True, gpu_runner=True, structured_outputs_workers=2)
    assert engine._structured.row_workers.wait_ready(60), "made with the engine, started"
    got = run_to_completion(engine, prompts, params)
    _assert_clean(engine)
    _assert_same(got, want)
    assert engine._structured.row_workers.rows_built > 0, "the workers must have built rows"
    engine._structured.close()


def test_pipelined_with_preemption_and_chunked_prefill(tiny_checkpoint):
    """A KV pool too small for the batch (recompute preemption while tokens are in
    flight) and a small token budget (prefill chunks next to decodes)."""
    path = tiny_checkpoint("llama")
    prompts = random_prompts(lengths=(30, 45, 12, 60, 25, 50), seed=5)
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    args = dict(num_gpu_blocks_override=22, block_size=8, max_num_batched_tokens=48, max_num_seqs=6)
    want, sequential = _outputs(path, prompts, params, pipelined=False, **args)
    got, pipelined = _outputs(path, prompts, params, pipelined=True, **args)
    _assert_same(got, want)
    assert sequential.scheduler.num_preemptions > 0, "the test must preempt"
    assert pipelined.scheduler.num_preemptions > 0


def test_pipelined_abort_mid_flight(tiny_checkpoint):
    """Aborting requests while their tokens are in flight frees everything; the others
    finish as they would alone."""
    path = tiny_checkpoint("llama")
    prompts = random_prompts(lengths=(9, 20, 14, 31), seed=9)
    params = SamplingParams(temperature=0.0, max_tokens=15, ignore_eos=True)
    results = {}
    for pipelined in (False, True):
        engine = _engine(path, pipelined, gpu_runner=True)
        for i, prompt in enumerate(prompts):
            engine.add_request(f"r{i}", prompt, params)
        finished = {}
        for step in range(200):
            if step == 4:
                engine.abort_request(["r1", "r3"])
            for output in engine.step():
                if output.finished:
                    finished[output.request_id] = output
            if not engine.has_unfinished_requests():
                break
        assert set(finished) == {"r0", "r2"}
        _assert_clean(engine)
        results[pipelined] = [finished["r0"], finished["r2"]]
    _assert_same(results[True], results[False])


def test_length_limited_requests_get_no_token_in_flight(tiny_checkpoint):
    """A request whose next token reaches max_tokens is not scheduled again."""
    path = tiny_checkpoint("llama")
    engine = _engine(path, pipelined=True, gpu_runner=False)
    engine.add_request("a", [5, 6, 7], SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True))
    engine.add_request("b", [5, 6, 8], SamplingParams(temperature=0.0, max_tokens=9, ignore_eos=True))
    engine.step()                       # prefill: both sample their first token
    a, b = (engine.scheduler.running[i] for i in range(2))
    assert (a.num_inflight_tokens, b.num_inflight_tokens) == (1, 1)
    batch = engine.scheduler.schedule()   # what step 2 would compute
    assert [item.num_new_tokens for item in batch.scheduled] == [1, 1]
    launched = engine._launch(batch, engine._inflight)
    assert a.num_inflight_tokens == 1, "a's second token is its last: nothing more in flight"
    assert b.num_inflight_tokens == 2
    engine._finish_step(engine._inflight)
    engine._inflight = launched
    assert (a.num_inflight_tokens, b.num_inflight_tokens) == (0, 1)


def _tokenizer_free_llama(folder) -> str:
    """A tiny random Llama without tokenizer files, so this test also runs on a machine
    without the embedded model (the GPU machine): there it covers CUDA graphs, pinned
    copies and the device-side input ids."""
    import torch
    import transformers
    config = transformers.LlamaConfig(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, initializer_range=0.2,
        max_position_embeddings=1024, eos_token_id=2)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    return str(folder)


def test_pipelined_token_ids_any_device(tmp_path):
    """Token ids only (no tokenizer): greedy, seeded sampling, logprobs, stop token ids,
    EOS, n > 1, and more requests than max_num_seqs (admission while tokens fly)."""
    path = _tokenizer_free_llama(tmp_path)
    rng = random.Random(11)
    prompts = [[rng.randrange(3, 512) for _ in range(rng.randint(1, 90))] for _ in range(24)]
    kinds = [SamplingParams(temperature=0.0, max_tokens=rng.randint(1, 40), ignore_eos=True),
             SamplingParams(temperature=0.8, seed=5, max_tokens=30, ignore_eos=True),
             SamplingParams(temperature=0.0, max_tokens=25, logprobs=3, ignore_eos=True),
             SamplingParams(temperature=0.0, max_tokens=60),            # may stop at EOS
             SamplingParams(temperature=0.7, seed=9, n=3, max_tokens=20, stop_token_ids=[7, 8, 9])]
    params = [kinds[i % len(kinds)] for i in range(len(prompts))]
    args = dict(dtype="float32", skip_tokenizer_init=True, max_num_seqs=8, max_model_len=512)
    want, _ = _outputs(path, prompts, params, pipelined=False, **args)
    got, engine = _outputs(path, prompts, params, pipelined=True, **args)
    _assert_same(got, want)
    assert engine.get_stats().num_generation_tokens == _num_tokens(want)


def _num_tokens(outputs) -> int:
    return sum(len(c.token_ids) for o in outputs for c in o.outputs)
