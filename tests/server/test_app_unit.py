"""The FastAPI app over a fake engine, in process: shapes, SSE framing, errors, auth.

The same behaviour is checked end to end against a real `tamis serve` in
``test_openai_e2e.py``; these run in about a second and pin the framing rules.
"""
from __future__ import annotations

import asyncio
import time
import json

import httpx
import pytest
from transformers import AutoTokenizer

from fake_engine import FakeEngine
from tamis.engine.async_engine import AsyncEngine
from tamis.server.app import build_app
from tamis.server.context import ServerContext

KEY = "sk-test"


@pytest.fixture(scope="module")
def tokenizer(smollm2_path):
    return AutoTokenizer.from_pretrained(smollm2_path)


@pytest.fixture
def app_factory(tokenizer):
    engines = []

    def make(api_key=None, max_waiting=64, max_body_bytes=1 << 20, **fake_kwargs):
        engine = AsyncEngine(FakeEngine(tokenizer, **fake_kwargs), max_waiting=max_waiting)
        engines.append(engine)
        ctx = ServerContext(engine=engine, tokenizer=tokenizer, model_names=["smol"],
                            max_model_len=256)
        return build_app(ctx, api_key=api_key, max_body_bytes=max_body_bytes)

    yield make
    for engine in engines:
        engine.shutdown()


def call(app, method, path, body=None, headers=None):
    async def go():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return await client.request(method, path, json=body, headers=headers)
    return asyncio.run(go())


def sse_events(text: str) -> list:
    assert text.endswith("data: [DONE]\n\n"), text[-200:]
    frames = text.split("\n\n")
    assert frames[-1] == ""
    events = []
    for frame in frames[:-2]:
        assert frame.startswith("data: "), frame
        events.append(json.loads(frame[len("data: "):]))
    return events


def assert_error(response, status, param=None):
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["message"]
    if param is not None:
        assert body["error"]["param"] == param, body
    return body["error"]


def test_completion_and_usage(app_factory):
    app = app_factory()
    r = call(app, "POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 4, "n": 2})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "text_completion" and body["model"] == "smol"
    assert [c["index"] for c in body["choices"]] == [0, 1]
    assert all(c["finish_reason"] == "length" for c in body["choices"])
    assert body["usage"]["completion_tokens"] == 8
    assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + 8


def test_completion_list_prompts_number_choices_per_prompt(app_factory):
    app = app_factory()
    r = call(app, "POST", "/v1/completions", {"prompt": ["a", "b"], "max_tokens": 2,
                                              "n": 2, "echo": True})
    body = r.json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    assert body["choices"][0]["text"].startswith("a")


def test_chat_stream_role_first_then_content_then_usage(app_factory):
    app = app_factory()
    r = call(app, "POST", "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "n": 2,
        "stream": True, "stream_options": {"include_usage": True}, "logprobs": True,
        "top_logprobs": 2})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r.text)
    assert [c["delta"] for c in events[0]["choices"]] == [{"role": "assistant", "content": ""}] * 2
    texts = {0: "", 1: ""}
    finishes = {}
    for event in events[1:-1]:
        assert event["object"] == "chat.completion.chunk" and event["usage"] is None
        for choice in event["choices"]:
            texts[choice["index"]] += choice["delta"].get("content", "")
            if choice["finish_reason"]:
                finishes[choice["index"]] = choice["finish_reason"]
            if choice["delta"].get("content"):
                assert len(choice["logprobs"]["content"][0]["top_logprobs"]) == 2
    assert finishes == {0: "length", 1: "length"}
    assert texts[0] and texts[1] and texts[0] != texts[1]
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 10


def test_stop_string_is_excluded(app_factory):
    app = app_factory()
    r = call(app, "POST", "/v1/completions", {"prompt": "x", "max_tokens": 30, "stop": ["fox"]})
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "stop" and "fox" not in choice["text"]
    assert choice["text"].strip().endswith("brown")


@pytest.mark.parametrize("path,body,status,param", [
    ("/v1/completions", {"prompt": "x", "suffix": "y"}, 400, "suffix"),
    ("/v1/completions", {"prompt": "x", "model": "nope"}, 404, "model"),
    ("/v1/completions", {"prompt": "x", "temperature": -1}, 400, "temperature"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 10_000}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "x " * 300}, 400, "prompt"),
    ("/v1/completions", {"prompt": [10**9]}, 400, "prompt"),
    ("/v1/completions", {"prompt": []}, 400, "prompt"),
    ("/v1/completions", {"max_tokens": 3}, 400, "prompt"),
    ("/v1/completions", {"prompt": "x", "n": "many"}, 400, "n"),
    ("/v1/completions", {"prompt": "x", "logprobs": 99}, 400, "logprobs"),
    ("/v1/completions", {"prompt": "x", "guided_json": {"type": "object"}}, 400, "guided_json"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                              "guided_choice": ["a"]}, 400, "guided_choice"),
    ("/v1/chat/completions", {"messages": []}, 400, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                              "top_logprobs": 2}, 400, "top_logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                              "tool_choice": "required"}, 400, "tool_choice"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                              "tools": [{"type": "function", "function": {"name": "f"}}],
                              "tool_choice": {"type": "function",
                                              "function": {"name": "g"}}}, 400, "tool_choice"),
])
def test_bad_input_gets_openai_error_then_a_good_request_works(app_factory, path, body,
                                                                status, param):
    app = app_factory()
    assert_error(call(app, "POST", path, body), status, param)
    ok = call(app, "POST", "/v1/completions", {"prompt": "fine", "max_tokens": 2})
    assert ok.status_code == 200


def test_guided_fields_name_their_replacement(app_factory):
    err = assert_error(call(app_factory(), "POST", "/v1/completions",
                            {"prompt": "x", "guided_regex": "a+"}), 400)
    assert "structured_outputs.regex" in err["message"]


def test_malformed_json_body_is_400(app_factory):
    async def go():
        transport = httpx.ASGITransport(app=app_factory())
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return await client.post("/v1/completions", content=b"{not json",
                                     headers={"content-type": "application/json"})
    error = assert_error(asyncio.run(go()), 400)
    assert error["param"] is None and "not valid JSON at character 1" in error["message"]


def test_lone_surrogate_is_400_naming_the_field(app_factory):
    app = app_factory()

    async def go(raw: bytes):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return await client.post("/v1/chat/completions", content=raw,
                                     headers={"content-type": "application/json"})
    bad = b'{"model": "smol", "max_tokens": 2, "messages": [{"role": "user", "content": "a \\ud800"}]}'
    error = assert_error(asyncio.run(go(bad)), 400)
    assert "messages.0.content" in error["message"] and "surrogate" in error["message"]
    good = b'{"model": "smol", "max_tokens": 2, "messages": [{"role": "user", "content": "a \\ud83d\\ude00"}]}'
    assert asyncio.run(go(good)).status_code == 200


def test_engine_failure_is_400_before_streaming(app_factory):
    app = app_factory()
    app.state.ctx.engine.engine.fail_token = 7
    ok = call(app, "POST", "/v1/completions", {"prompt": [5, 6], "stream": True})
    assert ok.status_code == 200
    # finish_reason "error" on the first output: a 400 JSON body, not an SSE stream.
    r = call(app, "POST", "/v1/completions", {"prompt": [5, 7], "stream": True})
    assert "grammar failed" in assert_error(r, 400)["message"]


def test_api_key_guards_v1_but_not_health(app_factory):
    app = app_factory(api_key=KEY)
    for method, path in [("GET", "/v1/models"), ("POST", "/v1/completions"),
                         ("POST", "/v1/chat/completions"), ("GET", "/v1/models/smol"),
                         ("POST", "/tokenize")]:
        err = assert_error(call(app, method, path, {}), 401)
        assert err["code"] == "invalid_api_key"
        assert_error(call(app, method, path, {}, {"Authorization": "Bearer wrong"}), 401)
    assert call(app, "GET", "/health").status_code == 200
    ok = call(app, "GET", "/v1/models", headers={"Authorization": f"Bearer {KEY}"})
    assert ok.status_code == 200 and ok.json()["data"][0]["id"] == "smol"


def test_body_limit_is_413(app_factory):
    app = app_factory(max_body_bytes=1000)
    assert_error(call(app, "POST", "/v1/completions", {"prompt": "x" * 2000}), 413)


def test_overloaded_is_503_with_retry_after(app_factory):
    app = app_factory(max_waiting=1, step_seconds=0.05, max_running=1)

    async def go():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            body = {"prompt": "x", "max_tokens": 3}
            return await asyncio.gather(*(client.post("/v1/completions", json=body)
                                          for _ in range(4)))
    responses = asyncio.run(go())
    statuses = sorted(r.status_code for r in responses)
    assert statuses[0] == 200 and 503 in statuses, statuses
    refused = next(r for r in responses if r.status_code == 503)
    assert refused.headers["retry-after"] == "1"
    assert_error(refused, 503)


def test_tokenize_detokenize_roundtrip(app_factory, tokenizer):
    app = app_factory()
    r = call(app, "POST", "/tokenize", {"prompt": "hello world", "add_special_tokens": False})
    body = r.json()
    assert body["tokens"] == tokenizer.encode("hello world", add_special_tokens=False)
    assert body["count"] == len(body["tokens"]) and body["max_model_len"] == 256
    back = call(app, "POST", "/detokenize", {"tokens": body["tokens"]}).json()
    assert back["prompt"] == "hello world"
    chat = call(app, "POST", "/tokenize", {"messages": [{"role": "user", "content": "hi"}]})
    assert chat.json()["count"] > 5


def test_metrics_and_version(app_factory):
    app = app_factory()
    call(app, "POST", "/v1/completions", {"prompt": "x", "max_tokens": 3})
    text = call(app, "GET", "/metrics").text
    assert 'tamis:generation_tokens_total{engine="0",model_name="smol"} 3.0' in text
    assert 'tamis:request_success_total{engine="0",finished_reason="length",model_name="smol"} 1.0' in text
    assert "tamis:kv_cache_total_blocks" in text and "tamis:num_requests_running" in text
    assert call(app, "GET", "/version").json()["version"]


def test_shapes_validate_against_openapi(app_factory):
    from openapi_check import validate

    app = app_factory()
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "n": 2,
            "logprobs": True, "top_logprobs": 1}
    validate(call(app, "POST", "/v1/chat/completions", chat).json(),
             "CreateChatCompletionResponse")
    stream = call(app, "POST", "/v1/chat/completions",
                  {**chat, "stream": True, "stream_options": {"include_usage": True}})
    for event in sse_events(stream.text):
        validate(event, "CreateChatCompletionStreamResponse")
    validate(call(app, "POST", "/v1/completions", {"prompt": "x", "max_tokens": 3,
                                                   "logprobs": 2}).json(),
             "CreateCompletionResponse")
    validate(call(app, "GET", "/v1/models").json(), "ListModelsResponse")
    validate(call(app, "GET", "/v1/models/smol").json(), "Model")
    validate(call(app, "POST", "/v1/completions", {"prompt": "x", "n": 0}).json(),
             "ErrorResponse")


def test_continuous_usage_stats(app_factory):
    app = app_factory()
    r = call(app, "POST", "/v1/completions", {
        "prompt": "x", "max_tokens": 3, "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True}})
    events = sse_events(r.text)
    counts = [e["usage"]["completion_tokens"] for e in events[:-1]]
    assert counts == sorted(counts) and counts[-1] == 3
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 3


def test_prompts_too_long_are_refused_before_tokenizing_naming_the_field(app_factory):
    app = app_factory()                      # max_model_len 256
    huge = "word " * 200_000                 # 1 MB: more characters than 256 tokens can hold
    started = time.monotonic()
    error = assert_error(call(app, "POST", "/v1/completions",
                              {"model": "smol", "prompt": huge, "max_tokens": 2}), 400)
    assert error["param"] == "prompt" and "too long" in error["message"]
    assert time.monotonic() - started < 2, "the length alone decides: no tokenizing"
    error = assert_error(call(app, "POST", "/v1/chat/completions", {
        "model": "smol", "max_tokens": 2, "messages": [{"role": "user", "content": huge}]}), 400)
    assert error["param"] == "messages"
    long_chat = "word " * 300                # under the character bound, over 256 tokens
    error = assert_error(call(app, "POST", "/v1/chat/completions", {
        "model": "smol", "max_tokens": 2, "messages": [{"role": "user", "content": long_chat}]}),
        400)
    assert error["param"] == "messages" and "maximum context length" in error["message"]


def test_openapi_documents_the_error_answers(app_factory):
    spec = call(app_factory(), "GET", "/openapi.json").json()
    for path in ("/v1/completions", "/v1/chat/completions"):
        answers = spec["paths"][path]["post"]["responses"]
        assert {"400", "401", "404", "413", "503"} <= set(answers), sorted(answers)
        assert "422" not in answers, "bad bodies are answered 400, as OpenAI does"
        schema = answers["400"]["content"]["application/json"]["schema"]
        assert schema["$ref"].endswith("/ErrorBody")
    assert "ErrorBody" in spec["components"]["schemas"]
