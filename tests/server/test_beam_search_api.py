"""use_beam_search on a live `tamis serve` (SmolLM2 on CPU): the choices are the offline
LLM.beam_search's beams, best first; what beam search cannot honour is a 400 naming it."""
from __future__ import annotations

import httpx
import pytest

from live_server import server_fixture
from tamis import LLM, BeamSearchParams

KEY = "sk-tamis-beam"
PROMPT = "The capital of France is"

server = server_fixture("module", KEY)


@pytest.fixture(scope="module")
def raw(server):
    with httpx.Client(base_url=server, headers={"Authorization": f"Bearer {KEY}"},
                      timeout=120) as http:
        yield http


@pytest.fixture(scope="module")
def offline():
    return LLM(max_model_len=2048, kv_cache_memory_bytes="128MiB")


def completion(raw, **fields) -> httpx.Response:
    return raw.post("/v1/completions", json={"model": "smol", "prompt": PROMPT, "max_tokens": 6,
                                             "use_beam_search": True, **fields})


def test_completion_choices_are_the_offline_beams(raw, offline):
    response = completion(raw, n=3, length_penalty=0.5, logprobs=2, return_token_ids=True)
    assert response.status_code == 200, response.text
    body = response.json()
    expected = offline.beam_search([PROMPT], BeamSearchParams(beam_width=3, max_tokens=6,
                                                              length_penalty=0.5))[0].sequences
    tokenizer = offline.get_tokenizer()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert [c["token_ids"] for c in body["choices"]] == [s.output_token_ids for s in expected]
    assert [c["text"] for c in body["choices"]] == \
           [tokenizer.decode(s.output_token_ids, skip_special_tokens=True) for s in expected]
    assert len({c["text"] for c in body["choices"]}) == 3
    for choice in body["choices"]:
        assert choice["finish_reason"] == "length"
        assert len(choice["logprobs"]["tokens"]) == 6
        assert all(len(top) == 2 for top in choice["logprobs"]["top_logprobs"])
    assert body["usage"]["completion_tokens"] == 18


def test_several_prompts_number_choices_per_prompt(raw):
    response = completion(raw, n=2, prompt=["Hello", "One, two,"], max_tokens=3)
    assert response.status_code == 200, response.text
    assert [c["index"] for c in response.json()["choices"]] == [0, 1, 2, 3]


def test_stop_string_cuts_the_text(raw):
    free = completion(raw, n=2).json()["choices"][0]["text"]
    stop = free.split()[-1]   # a word the best beam writes
    for include in (False, True):
        response = completion(raw, n=2, stop=[stop], include_stop_str_in_output=include)
        assert response.status_code == 200, response.text
        choices = response.json()["choices"]
        assert any(c["finish_reason"] == "stop" for c in choices)
        for choice in choices:
            if choice["finish_reason"] == "stop":
                assert choice["stop_reason"] == stop
                assert choice["text"].endswith(stop) == include
                assert choice["text"].count(stop) == int(include)
            else:
                assert stop not in choice["text"]


def test_chat_beam_search(raw):
    response = raw.post("/v1/chat/completions", json={
        "model": "smol", "messages": [{"role": "user", "content": "Name a colour."}],
        "max_tokens": 5, "n": 2, "use_beam_search": True, "logprobs": True, "top_logprobs": 1})
    assert response.status_code == 200, response.text
    choices = response.json()["choices"]
    assert [c["index"] for c in choices] == [0, 1]
    assert all(c["message"]["role"] == "assistant" and c["message"]["content"] for c in choices)
    assert choices[0]["message"]["content"] != choices[1]["message"]["content"]
    assert all(len(c["logprobs"]["content"]) >= 1 for c in choices)


@pytest.mark.parametrize("fields,param", [
    (dict(stream=True), "stream"),
    (dict(best_of=4, n=2), "best_of"),
    (dict(top_p=0.5), "top_p"),
    (dict(presence_penalty=1.0), "presence_penalty"),
    (dict(structured_outputs={"choice": ["a", "b"]}), "structured_outputs"),
    (dict(n=11), "n"),
    (dict(n=0), "n"),
    (dict(length_penalty="long"), "length_penalty"),
])
def test_refusals_name_the_field(raw, fields, param):
    response = completion(raw, **fields)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
    assert completion(raw, n=2, max_tokens=2).status_code == 200   # the server still serves


def test_chat_stream_with_beam_search_is_refused(raw):
    response = raw.post("/v1/chat/completions", json={
        "model": "smol", "messages": [{"role": "user", "content": "Hi"}], "n": 2,
        "use_beam_search": True, "stream": True})
    assert response.status_code == 400 and response.json()["error"]["param"] == "stream"


def test_best_of_without_beam_search_is_refused(raw):
    response = raw.post("/v1/completions", json={"model": "smol", "prompt": PROMPT, "n": 1,
                                                 "best_of": 3, "max_tokens": 2})
    assert response.status_code == 400 and response.json()["error"]["param"] == "best_of"
