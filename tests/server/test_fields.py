"""Every request field is honoured or refused: the app over the real engine (embedded
SmolLM2, greedy), in process. Each honoured field's effect is checked; each refusal is a
400 naming the field, and the server answers a good request right after."""
from __future__ import annotations

import asyncio
import json
import logging
import random

import httpx
import pytest

from tamis.engine.async_engine import AsyncEngine
from tamis.engine.engine import LLMEngine
from tamis.server.app import build_app
from tamis.server.context import ServerContext

CAPITAL = [{"role": "user", "content": "What is the capital of France? One word."}]
GREEDY = {"temperature": 0, "max_tokens": 8}


@pytest.fixture(scope="module")
def app():
    engine = LLMEngine(model=None, kv_cache_memory_bytes="64MiB", max_model_len=512)
    async_engine = AsyncEngine(engine)
    ctx = ServerContext(engine=async_engine, tokenizer=engine.tokenizer, model_names=["smol"],
                        max_model_len=512, scheduling_policy="fcfs")
    yield build_app(ctx)
    async_engine.shutdown()


@pytest.fixture
def ctx(app):
    ctx = app.state.ctx
    yield ctx
    ctx.reject_unknown_fields = ctx.trust_request_chat_template = False


def post(app, path, body, headers=None):
    async def go():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t",
                                     timeout=120) as client:
            return await client.post(path, json=body, headers=headers)
    return asyncio.run(go())


def chat(app, **fields):
    return post(app, "/v1/chat/completions", {"messages": CAPITAL, **GREEDY, **fields})


def complete(app, prompt="The capital of France is", **fields):
    return post(app, "/v1/completions", {"prompt": prompt, **GREEDY, **fields})


def events(response) -> list[dict]:
    assert response.status_code == 200, response.text
    frames = [f for f in response.text.split("\n\n") if f]
    assert frames[-1] == "data: [DONE]"
    return [json.loads(f[len("data: "):]) for f in frames[:-1]]


def ok(response) -> dict:
    assert response.status_code == 200, response.text
    return response.json()


def refused(response, param: str) -> str:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param, error
    return error["message"]


def token_ids(app, text: str) -> list[int]:
    return app.state.ctx.tokenizer.encode(text, add_special_tokens=False)


# --- honoured fields --------------------------------------------------------------------

def test_bad_words_leave_the_greedy_answer(app):
    assert "Paris" in ok(chat(app))["choices"][0]["message"]["content"]
    for answer in (chat(app, bad_words=["Paris"]), complete(app, bad_words=["Paris"])):
        choice = ok(answer)["choices"][0]
        assert "Paris" not in (choice["text"] if "text" in choice else choice["message"]["content"])


def test_truncate_prompt_tokens_keeps_the_last_or_first_tokens(app):
    prompt = "one two three four five six seven eight nine ten"
    full = token_ids(app, prompt)
    left = ok(complete(app, prompt, truncate_prompt_tokens=4, return_token_ids=True))
    assert left["choices"][0]["prompt_token_ids"] == full[-4:]
    assert left["usage"]["prompt_tokens"] == 4
    right = ok(complete(app, prompt, truncate_prompt_tokens=4, truncation_side="right",
                        return_token_ids=True))
    assert right["choices"][0]["prompt_token_ids"] == full[:4]
    as_many = ok(complete(app, prompt, truncate_prompt_tokens=-1, return_token_ids=True))
    assert as_many["choices"][0]["prompt_token_ids"] == full
    chat_cut = ok(chat(app, truncate_prompt_tokens=5))
    assert chat_cut["usage"]["prompt_tokens"] == 5
    refused(complete(app, prompt, truncate_prompt_tokens=0), "truncate_prompt_tokens")
    refused(complete(app, prompt, truncate_prompt_tokens=600), "truncate_prompt_tokens")


def test_a_long_prompt_fits_once_truncated(app):
    prompt = "word " * 4000          # far past the 512-token context
    refused(complete(app, prompt), "prompt")
    body = ok(complete(app, prompt, truncate_prompt_tokens=16))
    assert body["usage"]["prompt_tokens"] == 16


def test_request_chat_template_and_its_kwargs(app, ctx):
    template = ("{% for m in messages %}<<{{ m['content'] }}>>{% endfor %}"
                "{{ greeting | default('') }}")
    fields = {"chat_template": template, "chat_template_kwargs": {"greeting": "HELLO"},
              "return_token_ids": True}
    assert "--trust-request-chat-template" in refused(chat(app, **fields), "chat_template")
    ctx.trust_request_chat_template = True
    body = ok(chat(app, **fields))
    rendered = ctx.tokenizer.decode(body["prompt_token_ids"])
    assert rendered == "<<What is the capital of France? One word.>>HELLO"
    refused(chat(app, chat_template_kwargs={"tokenize": True}), "chat_template_kwargs")


def test_cache_salt_isolates_the_prefix_cache(app):
    engine = app.state.ctx.engine.engine
    prompt = [random.Random(5).randrange(100, 40000) for _ in range(70)]   # 4 full blocks

    def hits_of(**fields) -> int:
        before = engine.get_stats().prefix_cache_hits
        ok(complete(app, prompt, max_tokens=2, **fields))
        return engine.get_stats().prefix_cache_hits - before

    assert hits_of(cache_salt="alice") == 0
    assert hits_of(cache_salt="alice") == 64
    assert hits_of(cache_salt="bob") == 0
    assert hits_of() == 0
    assert hits_of() == 64
    refused(complete(app, prompt, cache_salt=""), "cache_salt")


def test_prompt_logprobs_come_back(app):
    prompt = "The capital of France is"
    ids = token_ids(app, prompt)
    choice = ok(complete(app, prompt, prompt_logprobs=2))["choices"][0]
    entries = choice["prompt_logprobs"]
    assert len(entries) == len(ids) and entries[0] is None
    for token, entry in zip(ids[1:], entries[1:]):
        assert str(token) in entry and 2 <= len(entry) <= 3
        assert entry[str(token)]["logprob"] <= 0 and entry[str(token)]["rank"] >= 1
    body = ok(chat(app, prompt_logprobs=0))
    assert len(body["prompt_logprobs"]) == body["usage"]["prompt_tokens"]
    refused(complete(app, prompt, prompt_logprobs=1, stream=True), "prompt_logprobs")


def test_request_id_names_the_response_and_the_header(app):
    answer = complete(app, request_id="job-42")
    assert ok(answer)["id"] == "cmpl-job-42" and answer.headers["x-request-id"] == "job-42"
    answer = post(app, "/v1/chat/completions", {"messages": CAPITAL, **GREEDY,
                                                "request_id": "body-id"},
                  headers={"X-Request-Id": "header-id"})
    assert ok(answer)["id"] == "chatcmpl-header-id"
    assert answer.headers["x-request-id"] == "header-id"
    stream = chat(app, request_id="s-1", stream=True)
    assert {e["id"] for e in events(stream)} == {"chatcmpl-s-1"}
    assert stream.headers["x-request-id"] == "s-1"

    async def twice():   # the same id twice at once: both served
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t",
                                     timeout=120) as client:
            body = {"prompt": "Hi", **GREEDY, "request_id": "same"}
            return await asyncio.gather(*(client.post("/v1/completions", json=body)
                                          for _ in range(2)))
    assert [ok(r)["id"] for r in asyncio.run(twice())] == ["cmpl-same"] * 2
    refused(complete(app, request_id="bad\nid"), "request_id")


def test_return_token_ids_match_the_text(app):
    tokenizer = app.state.ctx.tokenizer
    for body in (ok(chat(app, return_token_ids=True)), ok(complete(app, return_token_ids=True))):
        choice = body["choices"][0]
        text = choice.get("text") if "text" in choice else choice["message"]["content"]
        assert tokenizer.decode(choice["token_ids"], skip_special_tokens=True) == text
        assert len(choice["token_ids"]) == body["usage"]["completion_tokens"]
    whole = ok(chat(app, return_token_ids=True))
    chunks = events(chat(app, return_token_ids=True, stream=True))
    assert chunks[0]["prompt_token_ids"] == whole["prompt_token_ids"]
    streamed = [t for c in chunks[1:] for choice in c["choices"] for t in choice["token_ids"]]
    assert streamed == whole["choices"][0]["token_ids"]
    chunks = events(complete(app, return_token_ids=True, stream=True))
    assert "prompt_token_ids" in chunks[0]["choices"][0]
    assert all("prompt_token_ids" not in c["choices"][0] for c in chunks[1:])


def test_return_tokens_as_token_ids_in_logprobs(app):
    body = ok(chat(app, logprobs=True, top_logprobs=2, return_token_ids=True,
                   return_tokens_as_token_ids=True))
    choice = body["choices"][0]
    assert [c["token"] for c in choice["logprobs"]["content"]] == [
        f"token_id:{t}" for t in choice["token_ids"]]
    assert all(top["token"].startswith("token_id:")
               for c in choice["logprobs"]["content"] for top in c["top_logprobs"])
    body = ok(complete(app, logprobs=1, return_token_ids=True, return_tokens_as_token_ids=True))
    choice = body["choices"][0]
    assert choice["logprobs"]["tokens"] == [f"token_id:{t}" for t in choice["token_ids"]]


def test_chat_echo_prepends_the_continued_message(app):
    start = "The capital of France is"
    messages = [CAPITAL[0], {"role": "assistant", "content": start}]
    fields = {"messages": messages, **GREEDY, "add_generation_prompt": False,
              "continue_final_message": True}
    plain = ok(post(app, "/v1/chat/completions", fields))["choices"][0]["message"]["content"]
    echoed = ok(post(app, "/v1/chat/completions", {**fields, "echo": True}))
    assert echoed["choices"][0]["message"]["content"] == start + plain
    chunks = events(post(app, "/v1/chat/completions", {**fields, "echo": True, "stream": True}))
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == start + plain
    # The last message is the user's: nothing to echo for an assistant answer.
    assert not ok(chat(app, echo=True))["choices"][0]["message"]["content"].startswith("What")


WEATHER = {"name": "get_weather", "description": "Weather of a city",
           "parameters": {"type": "object",
                          "properties": {"city": {"type": "string", "maxLength": 20}},
                          "required": ["city"], "additionalProperties": False}}


def test_legacy_functions_are_served_as_tools(app):
    asked = [{"role": "user", "content": "What is the weather in Paris?"}]
    fields = {"messages": asked, "temperature": 0, "max_tokens": 40, "functions": [WEATHER],
              "function_call": {"name": "get_weather"}}
    body = ok(post(app, "/v1/chat/completions", fields))
    message = body["choices"][0]["message"]
    assert "tool_calls" not in message and message["function_call"]["name"] == "get_weather"
    assert isinstance(json.loads(message["function_call"]["arguments"])["city"], str)
    chunks = events(post(app, "/v1/chat/completions", {**fields, "stream": True}))
    calls = [c["choices"][0]["delta"]["function_call"] for c in chunks
             if c["choices"] and "function_call" in c["choices"][0]["delta"]]
    assert calls[0]["name"] == "get_weather"
    assert "".join(c.get("arguments", "") for c in calls) == message["function_call"]["arguments"]
    history = asked + [{"role": "assistant", "content": None, "function_call": {
        "name": "get_weather", "arguments": '{"city": "Paris"}'}},
        {"role": "function", "name": "get_weather", "content": "sunny"}]
    ok(post(app, "/v1/chat/completions", {"messages": history, **GREEDY,
                                          "functions": [WEATHER]}))
    refused(post(app, "/v1/chat/completions", {**fields, "tools": [
        {"type": "function", "function": WEATHER}]}), "functions")
    refused(chat(app, function_call="auto"), "function_call")


# --- refused fields ---------------------------------------------------------------------

@pytest.mark.parametrize("field, value", [
    ("prediction", {"type": "content", "content": "Paris"}),
    ("service_tier", "flex"),
    ("modalities", ["text", "audio"]),
    ("stream_interval", 4),
    ("extra_body", {"top_k": 2}),
    ("priority", 1),
    ("structured_output", {"choice": ["yes", "no"]}),   # a near-miss of structured_outputs
    ("max_token", 4),
])
def test_refused_fields_name_themselves_then_a_good_request_works(app, field, value):
    message = refused(chat(app, **{field: value}), field)
    assert field in message
    refused(complete(app, **{field: value}), field)
    assert ok(chat(app))["choices"][0]["message"]["content"]


def test_near_miss_names_the_right_spelling(app):
    assert "structured_outputs" in refused(chat(app, structured_output={"choice": ["a"]}),
                                           "structured_output")


def test_harmless_values_of_refused_fields_are_served(app):
    ok(chat(app, service_tier="auto", modalities=["text"], prediction=None, priority=0))
    ok(chat(app, service_tier="default", stream_interval=1))


def test_size_caps_on_stop_and_logit_bias(app):
    assert "128" in refused(chat(app, stop=[f"s{i}" for i in range(129)]), "stop")
    ok(chat(app, stop=[f"s{i}" for i in range(128)]))
    bias = {str(t): 1.0 for t in range(1025)}
    assert "1024" in refused(chat(app, logit_bias=bias), "logit_bias")
    ok(chat(app, logit_bias=dict(list(bias.items())[:1024])))


def test_unknown_fields_warn_once_or_are_refused(app, ctx, caplog):
    with caplog.at_level(logging.WARNING, logger="tamis.server"):
        ok(chat(app, vendor_tag="x"))
        ok(complete(app, vendor_tag="y"))
    warnings = [r for r in caplog.records if "vendor_tag" in r.getMessage()]
    assert len(warnings) == 1
    ctx.reject_unknown_fields = True
    assert "--reject-unknown-fields" in refused(chat(app, vendor_tag="x"), "vendor_tag")
    refused(complete(app, another_one=1), "another_one")
    ok(chat(app))


def test_a_flood_of_unknown_fields_is_refused(app, caplog):
    flood = {f"x{i}": 1 for i in range(65)}
    assert "65" in refused(chat(app, **flood), "x0")
    with caplog.at_level(logging.WARNING, logger="tamis.server"):
        ok(chat(app, **{"odd\nname": 1}))
    assert any("odd\\nname" in r.getMessage() for r in caplog.records)
    assert not any("odd\nname" in r.getMessage() for r in caplog.records)
