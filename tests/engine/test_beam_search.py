"""LLM.beam_search: the same sequences, in the same order, as transformers' beam search on
the tiny random Llama (fp32, CPU); beams share the prompt's KV blocks; bad parameters."""
from __future__ import annotations

import pytest
import torch

from tamis import LLM
from tamis.engine.beam_search import BeamSearchParams
from tiny_models import tiny_model

PROMPTS = [[1, 500, 600, 700, 800], list(range(100, 140)), [7, 9, 3000, 42, 17, 9000, 12]]
# A token the tiny Llama often produces after PROMPTS[0]: made an EOS id (beside the
# tokenizer's <|im_end|> = 2), hypotheses end at different lengths, some by EOS, some by
# max_tokens, and two EOS ids make both searches keep 3k candidates a step.
FREQUENT_TOKEN = 7088


@pytest.fixture(scope="module")
def hf_model():
    return tiny_model("llama")


@pytest.fixture(scope="module")
def llm(tiny_checkpoint):
    return LLM(str(tiny_checkpoint("llama")), kv_cache_memory_bytes="64MiB")


@pytest.fixture(scope="module")
def llm_two_eos(tiny_checkpoint):
    return LLM(str(tiny_checkpoint("llama", eos_token_id=FREQUENT_TOKEN)),
               kv_cache_memory_bytes="64MiB")


def transformers_beams(model, prompt: list[int], k: int, max_tokens: int, eos: set[int],
                       length_penalty: float) -> tuple[list[list[int]], list[float]]:
    """transformers' k best output token lists (each cut after its EOS) and scores."""
    out = model.generate(torch.tensor([prompt]), num_beams=k, num_return_sequences=k,
                         do_sample=False, early_stopping="never", length_penalty=length_penalty,
                         max_new_tokens=max_tokens, eos_token_id=sorted(eos), pad_token_id=2,
                         output_scores=True, return_dict_in_generate=True)
    beams = []
    for row in out.sequences.tolist():
        generated = row[len(prompt):]
        end = next((i + 1 for i, token in enumerate(generated) if token in eos), len(generated))
        beams.append(generated[:end])
    return beams, out.sequences_scores.tolist()


def assert_same_as_transformers(llm, hf_model, k, max_tokens, length_penalty=1.0):
    eos = llm.llm_engine.eos_token_ids
    params = BeamSearchParams(beam_width=k, max_tokens=max_tokens, length_penalty=length_penalty)
    outputs = llm.beam_search(PROMPTS, params)
    for prompt, output in zip(PROMPTS, outputs):
        expected, scores = transformers_beams(hf_model, prompt, k, max_tokens, eos, length_penalty)
        assert [s.output_token_ids for s in output.sequences] == expected
        assert [s.score for s in output.sequences] == pytest.approx(scores, abs=1e-4)
        assert all(s.tokens[:len(prompt)] == prompt for s in output.sequences)
    return outputs


@pytest.mark.parametrize("k,max_tokens", [(2, 8), (4, 12), (4, 16)])
def test_equals_transformers_beam_search(llm, hf_model, k, max_tokens):
    outputs = assert_same_as_transformers(llm, hf_model, k, max_tokens)
    best = outputs[0].sequences[0]
    assert best.text == llm.get_tokenizer().decode(best.tokens)
    assert best.finish_reason == "length" and len(best.output_token_ids) == max_tokens
    # cum_logprob sums the chosen tokens' logprobs from each step's candidate sets
    chosen = sum(step[t].logprob for step, t in zip(best.logprobs, best.output_token_ids))
    assert best.cum_logprob == pytest.approx(chosen)


@pytest.mark.parametrize("length_penalty", [1.0, 0.0, 2.0])
@pytest.mark.parametrize("k", [2, 4])
def test_equals_transformers_with_eos_hypotheses(llm_two_eos, hf_model, k, length_penalty):
    outputs = assert_same_as_transformers(llm_two_eos, hf_model, k, 12, length_penalty)
    reasons = {s.finish_reason for s in outputs[0].sequences}
    if length_penalty <= 1.0:   # a strong length reward lets only full-length beams win
        assert "stop" in reasons, "the EOS path is not exercised"
        if k == 4 and length_penalty == 1.0:
            assert reasons == {"stop", "length"}
        ended = [s for s in outputs[0].sequences if s.finish_reason == "stop"]
        assert all(s.stop_reason == s.tokens[-1] == FREQUENT_TOKEN for s in ended)


def test_ignore_eos_runs_every_beam_to_max_tokens(llm_two_eos, hf_model):
    params = BeamSearchParams(beam_width=4, max_tokens=10, ignore_eos=True)
    output = llm_two_eos.beam_search(PROMPTS[0], params)[0]
    expected, _ = transformers_beams(hf_model, PROMPTS[0], 4, 10, set(), 1.0)
    assert [s.output_token_ids for s in output.sequences] == expected
    assert all(s.finish_reason == "length" for s in output.sequences)
    assert any(FREQUENT_TOKEN in s.output_token_ids for s in output.sequences)


def test_beams_share_the_prompt_blocks(llm):
    """Every beam's request reuses the KV blocks of the prompt (and of the prefix beams
    have in common) from the prefix cache: same block ids, one reference per beam."""
    engine = llm.llm_engine
    block_size = engine.config.block_size
    prompt = PROMPTS[1]                                 # 40 tokens: 2 full blocks, 8 more
    num_shared = len(prompt) // block_size
    batches = []
    execute = engine.runner.execute_model

    def recording(batch, inflight):
        pool = engine.kv_cache.pool
        batches.append([(item.request.all_token_ids[:], item.request.block_ids[:], item.start,
                         [pool.blocks[b].ref_cnt for b in item.request.block_ids])
                        for item in batch.scheduled])
        return execute(batch, inflight)

    engine.reset_prefix_cache()
    engine.runner.execute_model = recording
    try:
        before = engine.get_stats().prefix_cache_hits
        llm.beam_search([prompt], BeamSearchParams(beam_width=4, max_tokens=12))
        hits = engine.get_stats().prefix_cache_hits - before
    finally:
        del engine.runner.execute_model
    first, *later = batches
    prompt_blocks = first[0][1][:num_shared]
    assert len(first) == 1 and first[0][2] == 0          # the prompt is computed once
    assert later and all(len(batch) == 4 for batch in later)
    for batch in later:
        for tokens, blocks, start, ref_counts in batch:
            assert blocks[:num_shared] == prompt_blocks
            assert ref_counts[:num_shared] == [4] * num_shared
            assert start >= num_shared * block_size     # only the tail is computed
    assert hits >= 4 * len(later) * num_shared * block_size
    # Once beams hold 48 tokens, beams with the same first 48 share the third block too.
    last = later[-1]
    by_prefix = {}
    for tokens, blocks, _, _ in last:
        by_prefix.setdefault(tuple(tokens[:3 * block_size]), set()).add(blocks[2])
    assert len(by_prefix) < 4 and all(len(ids) == 1 for ids in by_prefix.values())


def test_stop_strings_end_beams(llm):
    tokenizer = llm.get_tokenizer()
    free = llm.beam_search(PROMPTS[0], BeamSearchParams(beam_width=2, max_tokens=8))[0]
    stop = tokenizer.decode(free.sequences[0].output_token_ids[2:3]).strip() or "x"
    params = BeamSearchParams(beam_width=2, max_tokens=8, stop=[stop])
    output = llm.beam_search(PROMPTS[0], params)[0]
    assert any(s.finish_reason == "stop" for s in output.sequences)
    for sequence in output.sequences:
        text = tokenizer.decode(sequence.output_token_ids)
        if sequence.finish_reason == "stop":
            assert sequence.stop_reason == stop and stop in text
            assert stop not in tokenizer.decode(sequence.output_token_ids[:-1])
        else:
            assert stop not in text


@pytest.mark.parametrize("kwargs,field", [
    (dict(beam_width=0, max_tokens=4), "beam_width"),
    (dict(beam_width=2, max_tokens=0), "max_tokens"),
    (dict(beam_width=1.5, max_tokens=4), "beam_width"),
    (dict(beam_width=2, max_tokens=4, temperature=-1.0), "temperature"),
    (dict(beam_width=2, max_tokens=4, length_penalty=float("nan")), "length_penalty"),
    (dict(beam_width=2, max_tokens=4, stop=[""]), "stop"),
])
def test_bad_params_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        BeamSearchParams(**kwargs)


def test_bad_requests_are_refused_before_anything_runs(llm):
    with pytest.raises(ValueError, match="max_logprobs"):
        llm.beam_search(PROMPTS[0], BeamSearchParams(beam_width=11, max_tokens=4))
    with pytest.raises(ValueError, match="BeamSearchParams"):
        llm.beam_search(PROMPTS[0], {"beam_width": 2, "max_tokens": 4})
    with pytest.raises(ValueError, match="out of vocabulary"):
        llm.beam_search([PROMPTS[0], [10**9]], BeamSearchParams(beam_width=2, max_tokens=4))
    with pytest.raises(ValueError, match="non-empty"):
        llm.beam_search([PROMPTS[0], []], BeamSearchParams(beam_width=2, max_tokens=4))
    assert not llm.llm_engine.has_unfinished_requests()
