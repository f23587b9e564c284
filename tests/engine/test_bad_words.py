"""bad_words: a bad word's last token is banned where the output ends with the rest of it."""
from __future__ import annotations

import random

import pytest
import torch
from transformers import AutoTokenizer

from tamis.engine.request import Request
from tamis.engine.sampler import Sampler, SamplingMetadata, apply_bad_words
from tamis.engine.sampling_params import SamplingParams

V = 64


def _request(words: list[list[int]], outputs: list[int]) -> Request:
    params = SamplingParams(temperature=0.0, bad_words=["x"])
    params.bad_words_token_ids = words
    request = Request("r", [1, 2, 3], params)
    for token in outputs:
        request.append_output_token(token)
    return request


def _reference_banned(words: list[list[int]], outputs: list[int]) -> set[int]:
    """Token by token, the rule as stated: every earlier token of the word ends the output."""
    banned = set()
    for word in words:
        *prefix, last = word
        if len(prefix) <= len(outputs) and outputs[len(outputs) - len(prefix):] == prefix:
            banned.add(last)
    return banned


@pytest.mark.parametrize("seed", range(20))
def test_banned_tokens_match_the_reference(seed):
    rng = random.Random(seed)
    rows = []
    for _ in range(4):
        outputs = [rng.randrange(8) for _ in range(rng.randrange(0, 6))]
        words = [[rng.randrange(8) for _ in range(rng.randrange(1, 4))] for _ in range(3)]
        if outputs and rng.random() < 0.5:   # make sure some prefixes match
            words.append(outputs[-2:] + [rng.randrange(V)])
        rows.append((words, outputs))
    logits = torch.randn(len(rows), V)
    out = logits.clone()
    apply_bad_words(out, [_request(w, o) for w, o in rows])
    for row, (words, outputs) in enumerate(rows):
        banned = _reference_banned(words, outputs)
        assert set(torch.nonzero(torch.isinf(out[row])).flatten().tolist()) == banned
        kept = [t for t in range(V) if t not in banned]
        assert torch.equal(out[row, kept], logits[row, kept])


def test_sampler_never_picks_a_banned_token():
    logits = torch.zeros(1, V)
    logits[0, 7] = 10.0                                   # greedy would pick 7
    request = _request([[5, 7]], outputs=[4, 5])
    meta = SamplingMetadata.build([request], V, torch.device("cpu"))
    assert meta.any_bad_words
    assert Sampler()(logits.clone(), meta).token_ids[0] != 7
    other = _request([[6, 7]], outputs=[4, 5])            # prefix does not match: allowed
    meta = SamplingMetadata.build([other], V, torch.device("cpu"))
    assert Sampler()(logits.clone(), meta).token_ids[0] == 7


def test_bad_words_are_validated():
    with pytest.raises(ValueError, match="bad_words"):
        SamplingParams(bad_words=["ok", ""])
    with pytest.raises(ValueError, match="bad_words"):
        SamplingParams(bad_words=["  "])
    assert SamplingParams(bad_words="one").bad_words == ["one"]


def test_token_sequences_cover_the_word_alone_and_after_a_space(smollm2_path):
    tokenizer = AutoTokenizer.from_pretrained(smollm2_path)
    params = SamplingParams(bad_words=["Paris", " hello"])
    params.update_from_tokenizer(tokenizer)
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    assert encode("Paris") in params.bad_words_token_ids
    assert encode(" Paris") in params.bad_words_token_ids
    assert encode("hello") in params.bad_words_token_ids   # leading space stripped first


def test_a_bad_word_leaves_the_greedy_output(smollm2_path):
    from tamis.engine.llm import LLM

    llm = LLM(kv_cache_memory_bytes="64MiB", max_model_len=512)
    prompt = [{"role": "user", "content": "What is the capital of France? One word."}]
    greedy = SamplingParams(temperature=0.0, max_tokens=12)
    before = llm.chat(prompt, greedy, use_tqdm=False)[0].outputs[0].text
    assert "Paris" in before
    banned = SamplingParams(temperature=0.0, max_tokens=12, bad_words=["Paris"])
    after = llm.chat(prompt, banned, use_tqdm=False)[0].outputs[0].text
    assert "Paris" not in after and after != before


def test_token_ids_outside_the_model_vocabulary_are_refused(smollm2_path):
    tokenizer = AutoTokenizer.from_pretrained(smollm2_path)
    params = SamplingParams(bad_words=["Paris"])
    with pytest.raises(ValueError, match="bad_words"):
        params.update_from_tokenizer(tokenizer, vocab_size=10)
    params.update_from_tokenizer(tokenizer, vocab_size=len(tokenizer))
    assert params.bad_words_token_ids
