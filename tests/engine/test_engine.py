"""LLMEngine end to end on tiny random checkpoints and SmolLM2, against transformers."""
from __future__ import annotations

import pytest
import torch

from engine_helpers import (TINY_ARCHS, hf_greedy, hf_prompt_logprobs, make_engine, random_prompts,
                            run_to_completion)
from tamis.engine.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_greedy_matches_transformers(tiny_checkpoint, arch):
    path = tiny_checkpoint(arch)
    prompts = random_prompts(seed=hash(arch) % 1000)
    engine = make_engine(path)
    outputs = run_to_completion(engine, prompts, GREEDY)
    for prompt, output in zip(prompts, outputs):
        assert output.outputs[0].token_ids == hf_greedy(path, prompt, GREEDY.max_tokens), len(prompt)
    assert engine.kv_cache.num_free_blocks == engine.kv_cache.num_blocks


def test_smollm2_greedy_matches_transformers(smollm2_path):
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(smollm2_path)
    texts = ["Hi", "The capital of France is", "def fibonacci(n):", "Once upon a time, " * 3,
             "List three colors:", "Le chat est", "1, 2, 3, 4, 5,", "A long story. " * 80]
    prompts = [tokenizer.encode(t) for t in texts]
    assert max(len(p) for p in prompts) > 300 and min(len(p) for p in prompts) == 1
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    engine = make_engine(smollm2_path)
    outputs = run_to_completion(engine, prompts, params)
    for prompt, output in zip(prompts, outputs):
        assert output.outputs[0].token_ids == hf_greedy(smollm2_path, prompt, 6)


@pytest.mark.parametrize("arch", ["llama", "mistral"])
def test_prompt_logprobs_match_transformers(tiny_checkpoint, arch):
    path = tiny_checkpoint(arch)
    prompts = random_prompts(lengths=(3, 70), seed=1)
    # A small token budget splits the 70-token prompt into chunks: logprobs must join up.
    engine = make_engine(path, max_num_batched_tokens=32, max_num_seqs=4)
    params = SamplingParams(temperature=0.0, max_tokens=2, prompt_logprobs=3, logprobs=2)
    outputs = run_to_completion(engine, prompts, params)
    for prompt, output in zip(prompts, outputs):
        got = output.prompt_logprobs
        assert len(got) == len(prompt) and got[0] is None
        ours = torch.tensor([got[i][prompt[i]].logprob for i in range(1, len(prompt))])
        torch.testing.assert_close(ours, hf_prompt_logprobs(path, prompt), atol=1e-4, rtol=0)
        for i in range(1, len(prompt)):
            entry = got[i]
            assert len(entry) in (3, 4)                  # the prompt token plus the top 3
            ranks = sorted(lp.rank for t, lp in entry.items() if t != prompt[i] or lp.rank <= 3)
            assert ranks[:3] == [1, 2, 3]
        sample = output.outputs[0]
        assert len(sample.logprobs) == len(sample.token_ids) == 2
        for token, entry in zip(sample.token_ids, sample.logprobs):
            assert entry[token].rank == 1                # greedy picks the most likely token
        assert sample.cumulative_logprob == pytest.approx(
            sum(e[t].logprob for t, e in zip(sample.token_ids, sample.logprobs)))


def test_n_sequences_share_prompt_blocks(tiny_checkpoint):
    engine = make_engine(tiny_checkpoint("llama"), block_size=16)
    prompt = random_prompts(lengths=(70,), seed=2)[0]
    engine.add_request("fan", prompt, SamplingParams(n=4, temperature=1.0, seed=3, max_tokens=5))
    shared_seen = False
    final = None
    while engine.has_unfinished_requests():
        for output in engine.step():
            final = output if output.finished else final
        running = engine.scheduler.running
        if len(running) == 4:
            tables = [r.block_ids[:4] for r in running]   # the 4 full prompt blocks
            shared_seen |= all(t == tables[0] for t in tables)
            assert all(engine.kv_cache.pool.blocks[b].ref_cnt == 4 for b in tables[0])
    assert shared_seen
    assert [c.index for c in final.outputs] == [0, 1, 2, 3]
    assert all(len(c.token_ids) == 5 for c in final.outputs)
    assert len({tuple(c.token_ids) for c in final.outputs}) > 1   # different seeds, different samples
    assert engine.get_stats().prefix_cache_hits >= 3 * 64


def test_seeded_sampling_reproducible_alone_and_in_batch(tiny_checkpoint):
    path = tiny_checkpoint("qwen2")
    prompts = random_prompts(lengths=(9, 30, 4, 50), seed=4)
    seeded = SamplingParams(temperature=1.0, top_p=0.9, seed=1234, max_tokens=10, ignore_eos=True)
    alone = run_to_completion(make_engine(path), [prompts[0]], seeded)[0].outputs[0].token_ids
    again = run_to_completion(make_engine(path, seed=99), [prompts[0]], seeded)[0].outputs[0].token_ids
    others = SamplingParams(temperature=1.0, max_tokens=10, ignore_eos=True)
    batch = run_to_completion(make_engine(path), prompts, [seeded, others, others, others])
    assert alone == again == batch[0].outputs[0].token_ids
    different = SamplingParams(temperature=1.0, top_p=0.9, seed=4321, max_tokens=10, ignore_eos=True)
    assert run_to_completion(make_engine(path), [prompts[0]], different)[0].outputs[0].token_ids != alone


def test_stats_and_usage(tiny_checkpoint):
    engine = make_engine(tiny_checkpoint("llama"))
    engine.add_request("a", [5, 6, 7] * 10, SamplingParams(max_tokens=3))
    engine.step()
    stats = engine.get_stats()
    assert stats.num_running == 1 and stats.num_waiting == 0
    assert 0.0 < stats.kv_cache_usage <= 1.0
    assert stats.num_free_blocks == stats.num_total_blocks - 2
    assert stats.num_prompt_tokens == 30 and stats.num_generation_tokens == 1
    while engine.has_unfinished_requests():
        engine.step()
    stats = engine.get_stats()
    assert stats.num_finished_requests == 1 and stats.kv_cache_usage == 0.0


def test_structured_choice_and_failed_grammar(tiny_checkpoint, monkeypatch):
    from tamis.constrain import StructuredOutputsParams
    from tamis.engine.structured_output import StructuredOutputManager

    engine = make_engine(tiny_checkpoint("llama"))
    choice = SamplingParams(temperature=0.0, max_tokens=10,
                            structured_outputs=StructuredOutputsParams(choice=["yes", "no"]))
    out = run_to_completion(engine, [[500, 600, 700]], choice)[0].outputs[0]
    assert out.text in ("yes", "no") and out.finish_reason == "stop"

    # A regex that cannot compile: refused at add_request (cheap syntax check) or, at the
    # latest, that request alone finishes with finish_reason "error" and the message.
    bad = SamplingParams(structured_outputs=StructuredOutputsParams(regex="(unclosed"))
    try:
        engine.add_request("bad-regex", [5, 6], bad)
    except ValueError as exc:
        assert str(exc)
    else:
        failed = None
        while engine.has_unfinished_requests():
            for o in engine.step():
                failed = o if o.finished else failed
        assert failed.outputs[0].finish_reason == "error" and failed.error

    def broken(self, request):
        raise RuntimeError("grammar exploded")
    monkeypatch.setattr(StructuredOutputManager, "is_ready", broken)
    engine.add_request("fails", [5, 6], choice)
    engine.add_request("fine", [5, 6], GREEDY)
    done = {}
    while engine.has_unfinished_requests():
        done.update({o.request_id: o for o in engine.step() if o.finished})
    assert done["fails"].outputs[0].finish_reason == "error" and done["fails"].error == "grammar exploded"
    assert len(done["fine"].outputs[0].token_ids) == GREEDY.max_tokens
    assert engine.kv_cache.num_free_blocks == engine.kv_cache.num_blocks


def test_constraint_failing_mid_decode_finishes_with_error(tiny_checkpoint, monkeypatch):
    """A matcher that fails while decoding ends its request alone with finish_reason "error"
    and the manager's message; the other request and the KV pool are unaffected."""
    from tamis.constrain import StructuredOutputsParams
    from tamis.engine.structured_output import StructuredOutputManager

    engine = make_engine(tiny_checkpoint("llama"))
    real_fill = StructuredOutputManager.fill_bitmask

    def failing_fill(self, requests):
        for request in requests:
            if request.request_id == "fails" and request.num_output_tokens >= 1:
                self._fail(request.request_id, RuntimeError("automaton too large"))
        return real_fill(self, requests)
    monkeypatch.setattr(StructuredOutputManager, "fill_bitmask", failing_fill)
    constrained = SamplingParams(temperature=0.0, max_tokens=8,
                                 structured_outputs=StructuredOutputsParams(regex="[a-z]{20}"))
    engine.add_request("fails", [5, 6], constrained)
    engine.add_request("fine", [5, 6], GREEDY)
    done = {}
    while engine.has_unfinished_requests():
        done.update({o.request_id: o for o in engine.step() if o.finished})
    failed = done["fails"]
    assert failed.outputs[0].finish_reason == "error"
    assert "automaton too large" in failed.error
    assert len(done["fine"].outputs[0].token_ids) == GREEDY.max_tokens
    assert engine.kv_cache.num_free_blocks == engine.kv_cache.num_blocks


def test_output_kinds_and_abort(tiny_checkpoint):
    from tamis.engine.sampling_params import RequestOutputKind
    engine = make_engine(tiny_checkpoint("llama"))
    prompt = [500, 600, 700, 800]
    full = run_to_completion(engine, [prompt], GREEDY, prefix="c")[0].outputs[0]

    delta = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, output_kind=RequestOutputKind.DELTA)
    final_only = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True,
                                output_kind=RequestOutputKind.FINAL_ONLY)
    engine.add_request("d", prompt, delta)
    engine.add_request("f", prompt, final_only)
    engine.add_request("gone", list(range(100, 140)), GREEDY)
    first_step = engine.step()
    engine.abort_request(["gone", "unknown-id"])
    seen = {"d": [], "f": [], "gone": []}
    text = ""
    steps = [first_step]
    while engine.has_unfinished_requests():
        steps.append(engine.step())
    for outputs in steps:
        for output in outputs:
            seen[output.request_id].append(output)
            if output.request_id == "d":
                text += output.outputs[0].text
    assert all(not o.finished for o in seen["gone"])           # aborted: never reported finished
    tokens = [t for o in seen["d"] for t in o.outputs[0].token_ids]
    assert tokens == full.token_ids and text == full.text and len(seen["d"]) > 1
    assert len(seen["f"]) == 1 and seen["f"][0].outputs[0].token_ids == full.token_ids
    assert engine.kv_cache.num_free_blocks == engine.kv_cache.num_blocks
