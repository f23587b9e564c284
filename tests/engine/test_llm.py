"""The offline API on the embedded SmolLM2: generate, chat, parameters through the engine, CLI."""
from __future__ import annotations

import pytest

from tamis import LLM, SamplingParams


@pytest.fixture(scope="module")
def llm():
    return LLM(kv_cache_memory_bytes="128MiB", max_model_len=1024)


GREEDY = dict(temperature=0.0)


def test_generate_keeps_input_order_and_accepts_token_ids(llm):
    tokenizer = llm.get_tokenizer()
    prompts = ["The capital of France is", "1, 2, 3, 4,", {"prompt": "Hello"},
               tokenizer.encode("The capital of France is")]
    outputs = llm.generate(prompts, SamplingParams(max_tokens=5, **GREEDY), use_tqdm=False)
    assert [o.request_id for o in outputs] == sorted((o.request_id for o in outputs), key=int)
    assert outputs[0].prompt == "The capital of France is" and outputs[3].prompt is None
    assert outputs[0].outputs[0].token_ids == outputs[3].outputs[0].token_ids
    assert "Paris" in outputs[0].outputs[0].text
    assert outputs[1].outputs[0].text.startswith(" 5")
    assert all(o.finished and o.outputs[0].finish_reason == "length" for o in outputs)
    single = llm.generate(tokenizer.encode("1, 2, 3, 4,"), SamplingParams(max_tokens=5, **GREEDY),
                          use_tqdm=True)
    assert single[0].outputs[0].token_ids == outputs[1].outputs[0].token_ids


def test_per_prompt_params_and_all_or_nothing(llm):
    outs = llm.generate(["a", "b"], [SamplingParams(max_tokens=2, **GREEDY),
                                     SamplingParams(max_tokens=4, **GREEDY)], use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in outs] == [2, 4]
    with pytest.raises(ValueError, match="2 entries for 3 prompts"):
        llm.generate(["a", "b", "c"], [SamplingParams()] * 2)
    with pytest.raises(ValueError, match="prompt is empty"):
        llm.generate(["fine", ""], SamplingParams(max_tokens=2))
    assert not llm.llm_engine.has_unfinished_requests()


def test_chat_uses_the_template_and_stops_at_end_of_turn(llm):
    out = llm.chat([{"role": "user", "content": "What is the capital of France? One word."}],
                   SamplingParams(max_tokens=20, **GREEDY), use_tqdm=False)[0]
    tokenizer = llm.get_tokenizer()
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France? One word."}],
        tokenize=False, add_generation_prompt=True)
    assert out.prompt_token_ids == tokenizer.encode(rendered, add_special_tokens=False)
    assert "Paris" in out.outputs[0].text
    assert out.outputs[0].finish_reason == "stop" and out.outputs[0].token_ids[-1] == tokenizer.eos_token_id
    two = llm.chat([[{"role": "user", "content": "Hi"}], [{"role": "user", "content": "Bye"}]],
                   SamplingParams(max_tokens=3, **GREEDY), use_tqdm=False)
    assert len(two) == 2


@pytest.fixture(scope="module")
def tiny(tiny_checkpoint):
    return LLM(str(tiny_checkpoint("llama")), kv_cache_memory_bytes="64MiB")


PROMPT = [500, 600, 700, 800]


def test_stop_strings_and_stop_token_ids(tiny):
    base = tiny.generate(PROMPT, SamplingParams(max_tokens=12, ignore_eos=True, **GREEDY),
                         use_tqdm=False)[0].outputs[0]
    assert base.text == tiny.get_tokenizer().decode(base.token_ids)
    stop = base.text[len(base.text) // 2:len(base.text) // 2 + 3]
    cut = base.text.find(stop)
    out = tiny.generate(PROMPT, SamplingParams(max_tokens=12, stop=[stop], **GREEDY),
                        use_tqdm=False)[0].outputs[0]
    assert out.text == base.text[:cut] and out.finish_reason == "stop" and out.stop_reason == stop
    out = tiny.generate(PROMPT, SamplingParams(max_tokens=12, stop=[stop], include_stop_str_in_output=True,
                                               **GREEDY), use_tqdm=False)[0].outputs[0]
    assert out.text == base.text[:cut + len(stop)]
    token = base.token_ids[4]
    first = base.token_ids.index(token)
    out = tiny.generate(PROMPT, SamplingParams(max_tokens=12, stop_token_ids=[token], **GREEDY),
                        use_tqdm=False)[0].outputs[0]
    assert out.token_ids == base.token_ids[:first + 1] and out.stop_reason == token
    assert out.text == tiny.get_tokenizer().decode(base.token_ids[:first])   # stop token's text left out


def test_min_tokens_ignore_eos_and_max_tokens(tiny):
    eos = tiny.llm_engine.tokenizer.eos_token_id
    push_eos = {eos: 100.0}
    out = tiny.generate(PROMPT, SamplingParams(max_tokens=10, logit_bias=push_eos, **GREEDY),
                        use_tqdm=False)[0].outputs[0]
    assert out.token_ids == [eos] and out.finish_reason == "stop" and out.stop_reason is None
    out = tiny.generate(PROMPT, SamplingParams(max_tokens=10, min_tokens=3, logit_bias=push_eos, **GREEDY),
                        use_tqdm=False)[0].outputs[0]
    assert len(out.token_ids) == 4 and out.token_ids[-1] == eos and eos not in out.token_ids[:3]
    out = tiny.generate(PROMPT, SamplingParams(max_tokens=5, ignore_eos=True, logit_bias=push_eos, **GREEDY),
                        use_tqdm=False)[0].outputs[0]
    assert out.token_ids == [eos] * 5 and out.finish_reason == "length"


def test_penalties_allowed_ids_and_bias_through_the_engine(tiny):
    params = dict(max_tokens=8, ignore_eos=True, **GREEDY)
    plain = tiny.generate(PROMPT, SamplingParams(**params), use_tqdm=False)[0].outputs[0].token_ids
    assert len(set(plain)) < len(plain)                        # the tiny model repeats itself
    for extra in ({"repetition_penalty": 5.0}, {"presence_penalty": 2.0}, {"frequency_penalty": 2.0}):
        out = tiny.generate(PROMPT, SamplingParams(**params, **extra), use_tqdm=False)[0].outputs[0]
        assert out.token_ids != plain, extra
    out = tiny.generate(PROMPT, SamplingParams(**params, allowed_token_ids=[11, 12, 13]),
                        use_tqdm=False)[0].outputs[0]
    assert set(out.token_ids) <= {11, 12, 13}
    out = tiny.generate(PROMPT, SamplingParams(**params, logit_bias={42: 100.0}), use_tqdm=False)[0]
    assert out.outputs[0].token_ids == [42] * 8


def test_sampling_filters_and_seed_through_the_engine(tiny):
    def sample(**kw):
        return tiny.generate(PROMPT, SamplingParams(max_tokens=8, ignore_eos=True, **kw),
                             use_tqdm=False)[0].outputs[0].token_ids
    greedy = sample(temperature=0.0)
    assert sample(temperature=1.0, top_k=1, seed=3) == greedy
    assert sample(temperature=1.0, top_p=1e-6, seed=3) == greedy
    assert sample(temperature=1.0, min_p=1.0, seed=3) == greedy
    assert sample(temperature=1.5, seed=3) == sample(temperature=1.5, seed=3) != greedy


def test_logprobs_n_and_seed(tiny):
    params = SamplingParams(n=3, temperature=0.8, seed=5, max_tokens=6, logprobs=3, ignore_eos=True)
    a = tiny.generate(PROMPT, params, use_tqdm=False)[0]
    b = tiny.generate(PROMPT, params, use_tqdm=False)[0]
    assert [c.token_ids for c in a.outputs] == [c.token_ids for c in b.outputs]
    assert len(a.outputs) == 3 and len({tuple(c.token_ids) for c in a.outputs}) > 1
    for c in a.outputs:
        assert len(c.logprobs) == 6
        for token, entry in zip(c.token_ids, c.logprobs):
            assert token in entry and 3 <= len(entry) <= 4
            assert entry[token].decoded_token == tiny.get_tokenizer().decode([token])
        assert c.cumulative_logprob == pytest.approx(sum(e[t].logprob for t, e in zip(c.token_ids, c.logprobs)))


def test_tamis_generate_command(capsys):
    from tamis.cli import main
    code = main(["generate", "The capital of France is", "--max-tokens", "4",
                 "--kv-cache-memory", "64MiB", "--max-model-len", "256"])
    assert code == 0 and "Paris" in capsys.readouterr().out
    assert main(["generate", "x", "--max-tokens", "0"]) == 2
    assert "max_tokens" in capsys.readouterr().err
