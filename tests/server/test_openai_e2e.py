"""A real `tamis serve` (SmolLM2 on CPU, loopback, API key) driven by the official
`openai` client: one server per session, small max_tokens so the file runs in minutes."""
from __future__ import annotations

import asyncio
import json
import re
import time

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from live_server import server_fixture
from openapi_check import validate

KEY = "sk-tamis-e2e"
CHAT = [{"role": "user", "content": "Name a colour."}]


server = server_fixture("module", KEY)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key=KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def raw(server):
    with httpx.Client(base_url=server, headers={"Authorization": f"Bearer {KEY}"},
                      timeout=120) as http:
        yield http


def metric(server, name: str) -> float:
    text = httpx.get(server + "/metrics", timeout=10).text
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line.startswith(name + "{") or line.startswith(name + " ")]
    assert values, f"{name} missing from /metrics"
    return sum(values)


def _series(server, series: str) -> float:
    for line in httpx.get(server + "/metrics", timeout=10).text.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


# ---------------------------------------------------------------- basic generation

def test_models_and_health(client, server):
    assert [m.id for m in client.models.list().data] == ["smol"]
    assert httpx.get(server + "/health").status_code == 200
    assert httpx.get(server + "/version").json()["version"]


def test_chat_and_completion_validate_against_openapi(raw):
    chat = raw.post("/v1/chat/completions", json={"model": "smol", "messages": CHAT,
                                                  "max_tokens": 5, "logprobs": True,
                                                  "top_logprobs": 2})
    assert chat.status_code == 200, chat.text
    validate(chat.json(), "CreateChatCompletionResponse")
    cmpl = raw.post("/v1/completions", json={"model": "smol", "prompt": "The sky is",
                                             "max_tokens": 5, "logprobs": 2})
    assert cmpl.status_code == 200, cmpl.text
    validate(cmpl.json(), "CreateCompletionResponse")
    validate(raw.get("/v1/models").json(), "ListModelsResponse")
    with raw.stream("POST", "/v1/chat/completions",
                    json={"messages": CHAT, "max_tokens": 4, "stream": True,
                          "stream_options": {"include_usage": True}}) as stream:
        lines = [line for line in stream.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    for line in lines[:-1]:
        validate(json.loads(line[len("data: "):]), "CreateChatCompletionStreamResponse")


def test_chat_nonstream_n2_usage(client):
    r = client.chat.completions.create(model="smol", messages=CHAT, max_tokens=6, n=2,
                                       temperature=1.0, seed=1)
    assert [c.index for c in r.choices] == [0, 1]
    assert all(c.message.role == "assistant" and c.finish_reason in ("stop", "length")
               for c in r.choices)
    assert 2 <= r.usage.completion_tokens <= 12
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_chat_stream_role_first_and_include_usage(client):
    stream = client.chat.completions.create(model="smol", messages=CHAT, max_tokens=6,
                                            stream=True, n=2,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    first = chunks[0]
    assert {c.index for c in first.choices} == {0, 1}
    assert all(c.delta.role == "assistant" for c in first.choices)
    texts = {0: "", 1: ""}
    finish = {}
    for chunk in chunks[1:-1]:
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
            if c.finish_reason:
                finish[c.index] = c.finish_reason
    assert set(finish) == {0, 1}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0


def test_completion_stream_and_echo(client):
    chunks = list(client.completions.create(model="smol", prompt="1, 2, 3,", max_tokens=5,
                                            stream=True, temperature=0))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    full = client.completions.create(model="smol", prompt="1, 2, 3,", max_tokens=5,
                                     temperature=0)
    assert full.choices[0].text == text
    echo = client.completions.create(model="smol", prompt="1, 2, 3,", max_tokens=5,
                                     temperature=0, echo=True)
    assert echo.choices[0].text == "1, 2, 3," + text


def test_completion_token_id_prompts_and_list(client):
    r = client.completions.create(model="smol", prompt=[[504, 3458], [1, 2, 3]], max_tokens=3,
                                  n=2)
    assert sorted(c.index for c in r.choices) == [0, 1, 2, 3]
    assert r.usage.prompt_tokens == 5


def test_logprobs(client):
    r = client.chat.completions.create(model="smol", messages=CHAT, max_tokens=4,
                                       logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for item in content:
        assert item.logprob <= 0 and len(item.top_logprobs) == 3
        tops = [t.logprob for t in item.top_logprobs]
        assert tops == sorted(tops, reverse=True) and item.logprob <= tops[0] + 1e-4
    c = client.completions.create(model="smol", prompt="Hello", max_tokens=4, logprobs=2,
                                  extra_body={"ignore_eos": True})
    lp = c.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    assert "".join(lp.tokens) == c.choices[0].text


def test_stop_strings(client):
    r = client.completions.create(model="smol", prompt="1, 2, 3, 4, 5,", max_tokens=20,
                                  temperature=0, stop=[","])
    assert r.choices[0].finish_reason == "stop" and "," not in r.choices[0].text


def test_seed_reproducible(client):
    kwargs = dict(model="smol", messages=CHAT, max_tokens=8, temperature=1.0, top_p=1.0)
    a = client.chat.completions.create(seed=1234, **kwargs).choices[0].message.content
    b = client.chat.completions.create(seed=1234, **kwargs).choices[0].message.content
    assert a == b
    others = {client.chat.completions.create(seed=s, **kwargs).choices[0].message.content
              for s in (1, 2, 3)}
    assert len(others | {a}) > 1, "different seeds should not all give the same sample"


# ---------------------------------------------------------------- structured outputs

def test_structured_choice_regex_json_grammar(client):
    choice = client.chat.completions.create(
        model="smol", messages=[{"role": "user", "content": "Is water wet?"}], max_tokens=5,
        extra_body={"structured_outputs": {"choice": ["yes", "no"]}})
    assert choice.choices[0].message.content in ("yes", "no")
    regex = client.completions.create(
        model="smol", prompt="My phone number is", max_tokens=20,
        extra_body={"structured_outputs": {"regex": r"\d{3}-\d{4}"}})
    assert re.fullmatch(r"\d{3}-\d{4}", regex.choices[0].text)
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                               "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    js = client.chat.completions.create(
        model="smol", messages=[{"role": "user", "content": "A person as JSON."}],
        max_tokens=40, extra_body={"structured_outputs": {"json": schema}})
    jsonschema.validate(json.loads(js.choices[0].message.content), schema)
    grammar = 'root ::= "(" digit "+" digit ")"\ndigit ::= [0-9]'
    g = client.completions.create(model="smol", prompt="A sum:", max_tokens=10,
                                  extra_body={"structured_outputs": {"grammar": grammar}})
    assert re.fullmatch(r"\(\d\+\d\)", g.choices[0].text), g.choices[0].text


def test_response_format_json_schema_and_object(client):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10}},
              "required": ["city"], "additionalProperties": False}
    r = client.chat.completions.create(
        model="smol", messages=[{"role": "user", "content": "A city as JSON."}], max_tokens=30,
        response_format={"type": "json_schema",
                         "json_schema": {"name": "city", "schema": schema, "strict": True}})
    jsonschema.validate(json.loads(r.choices[0].message.content), schema)
    obj = client.chat.completions.create(
        model="smol", messages=[{"role": "user", "content": "Any JSON object."}],
        max_tokens=30, response_format={"type": "json_object"})
    if obj.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(obj.choices[0].message.content), dict)
    else:
        assert obj.choices[0].message.content.lstrip().startswith("{")


class Pet(BaseModel):
    name: str = Field(max_length=12)  # bounded, so max_tokens cannot cut the JSON
    legs: int = Field(ge=0, le=8)


def test_parse_with_pydantic_model(client):
    r = client.chat.completions.parse(
        model="smol", messages=[{"role": "user", "content": "Describe a pet as JSON."}],
        max_tokens=40, response_format=Pet)
    pet = r.choices[0].message.parsed
    assert isinstance(pet, Pet)


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                                    "unit": {"enum": ["c", "f"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}


def test_named_tool_call_arguments_validate(client):
    r = client.chat.completions.create(
        model="smol", messages=[{"role": "user", "content": "Weather in Paris?"}],
        max_tokens=40, tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    calls = r.choices[0].message.tool_calls
    assert len(calls) == 1 and calls[0].function.name == "get_weather"
    jsonschema.validate(json.loads(calls[0].function.arguments),
                        WEATHER["function"]["parameters"])


def test_required_tool_call_and_streamed_named_call(client):
    r = client.chat.completions.create(
        model="smol", messages=[{"role": "user", "content": "Weather in Oslo?"}],
        max_tokens=80, tools=[WEATHER], tool_choice="required", parallel_tool_calls=False)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert len(choice.message.tool_calls) == 1  # parallel_tool_calls=False: maxItems 1
    for call in choice.message.tool_calls:
        jsonschema.validate(json.loads(call.function.arguments),
                            WEATHER["function"]["parameters"])
    stream = client.chat.completions.create(
        model="smol", messages=[{"role": "user", "content": "Weather in Rome?"}],
        max_tokens=40, tools=[WEATHER], stream=True,
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    args, names = "", []
    for chunk in stream:
        for c in chunk.choices:
            for call in c.delta.tool_calls or []:
                names += [call.function.name] if call.function.name else []
                args += call.function.arguments or ""
    assert names == ["get_weather"]
    jsonschema.validate(json.loads(args), WEATHER["function"]["parameters"])


# ---------------------------------------------------------------- errors and auth

BAD_CASES = [
    ("/v1/completions", {"prompt": "x", "suffix": "y"}, 400),
    ("/v1/completions", {"prompt": "x", "model": "unknown"}, 404),
    ("/v1/completions", {"prompt": "x", "temperature": -0.5}, 400),
    ("/v1/completions", {"prompt": "x", "max_tokens": 100_000}, 400),
    ("/v1/completions", {"prompt": "hello " * 2100, "max_tokens": 1}, 400),
    ("/v1/completions", {"prompt": "x", "n": "two"}, 400),
    ("/v1/completions", {"prompt": "x", "guided_json": {"type": "object"}}, 400),
    ("/v1/chat/completions", {"messages": "not a list"}, 400),
    ("/v1/chat/completions", {"messages": CHAT, "structured_outputs": {"regex": "(unclosed"}},
     400),
    ("/v1/chat/completions", {"messages": CHAT, "structured_outputs": {"json": {
        "type": "object", "properties": {"a": {"type": "nonsense"}}}}}, 400),
    ("/v1/chat/completions", {"messages": CHAT, "structured_outputs": {
        "grammar": "root ::= undefined_rule"}}, 400),
    ("/v1/chat/completions", {"messages": CHAT, "structured_outputs": {"choice": []}}, 400),
    ("/v1/chat/completions", {"messages": CHAT, "response_format": {"type": "json_schema"}},
     400),
    ("/v1/chat/completions", {"messages": CHAT, "response_format": {"type": "xml"}}, 400),
    ("/v1/chat/completions", {"messages": CHAT, "tool_choice": "required"}, 400),
    ("/v1/chat/completions", {"messages": CHAT, "max_completion_tokens": 0}, 400),
    ("/v1/completions", {"prompt": "x", "stream_options": {"include_usage": True}}, 400),
]


@pytest.mark.parametrize("path,body,status", BAD_CASES)
def test_bad_input_then_good_request(raw, path, body, status):
    modes = (False,) if "stream_options" in body else (False, True)  # valid when streaming
    for stream in modes:
        r = raw.post(path, json={"max_tokens": 3, **body, "stream": stream})
        assert r.status_code == status, (stream, r.text)
        validate(r.json(), "ErrorResponse")
    ok = raw.post("/v1/completions", json={"prompt": "ok", "max_tokens": 2})
    assert ok.status_code == 200


def test_openai_client_raises_typed_errors(client):
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="x", max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="structured_outputs.choice"):
        client.chat.completions.create(model="smol", messages=CHAT, max_tokens=2,
                                       extra_body={"guided_choice": ["a", "b"]})


def test_auth_required_on_every_v1_route(server):
    routes = [("GET", "/v1/models"), ("GET", "/v1/models/smol"), ("POST", "/v1/completions"),
              ("POST", "/v1/chat/completions")]
    for method, path in routes:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
            r = httpx.request(method, server + path, json={}, headers=headers)
            assert r.status_code == 401, (path, headers, r.text)
            validate(r.json(), "ErrorResponse")
    assert httpx.get(server + "/health").status_code == 200
    bad = openai.OpenAI(base_url=server + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


# ---------------------------------------------------------------- load and disconnects

def test_200_concurrent_streams_mixed_constraints(server):
    async def one(client, i):
        kwargs = {}
        if i % 4 == 1:
            kwargs["extra_body"] = {"structured_outputs": {"choice": ["red", "blue"]}}
        elif i % 4 == 2:
            kwargs["extra_body"] = {"structured_outputs": {"regex": r"[a-z]{2,4}"}}
        stream = await client.completions.create(model="smol", prompt=f"Item {i}:",
                                                 max_tokens=4, stream=True, **kwargs)
        text = ""
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].text
        if i % 4 == 1:
            assert text in ("red", "blue"), text
        return text

    async def main():
        client = openai.AsyncOpenAI(base_url=server + "/v1", api_key=KEY, max_retries=0,
                                    timeout=300)
        results = await asyncio.gather(*(one(client, i) for i in range(200)),
                                       return_exceptions=True)
        await client.close()
        return results

    before = metric(server, "tamis:request_success_total")
    results = asyncio.run(main())
    errors = [r for r in results if isinstance(r, BaseException)]
    assert not errors, f"{len(errors)} errors, first: {errors[0]!r}"
    assert metric(server, "tamis:request_success_total") >= before + 200


def test_50_disconnects_free_everything(server):
    async def leave_early(http, i):
        body = {"model": "smol", "prompt": f"Story {i}:", "max_tokens": 400, "stream": True,
                "ignore_eos": True}
        async with http.stream("POST", "/v1/completions", json=body) as response:
            assert response.status_code == 200
            async for line in response.aiter_lines():
                if line.startswith("data: {"):
                    return  # closing the stream here disconnects mid-generation

    async def main():
        async with httpx.AsyncClient(base_url=server, timeout=120,
                                     headers={"Authorization": f"Bearer {KEY}"},
                                     limits=httpx.Limits(max_connections=100)) as http:
            await asyncio.gather(*(leave_early(http, i) for i in range(50)))

    aborted = 'tamis:request_success_total{engine="0",finished_reason="abort",model_name="smol"}'
    before = _series(server, aborted)
    asyncio.run(main())
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        running = metric(server, "tamis:num_requests_running")
        free = metric(server, "tamis:kv_cache_free_blocks")
        total = metric(server, "tamis:kv_cache_total_blocks")
        if running == 0 and free == total:
            break
        time.sleep(0.2)
    assert running == 0 and metric(server, "tamis:num_requests_waiting") == 0
    assert free == total, f"{total - free} KV blocks still held after the clients left"
    assert _series(server, aborted) == before + 50
    # A request right after still works.
    r = httpx.post(server + "/v1/completions", json={"prompt": "ok", "max_tokens": 2},
                   headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
    assert r.status_code == 200


def test_nonstreaming_client_that_leaves_is_aborted(server):
    aborted = 'tamis:request_success_total{engine="0",finished_reason="abort",model_name="smol"}'
    before = _series(server, aborted)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server + "/v1/completions", timeout=2,
                   json={"prompt": "Long story:", "max_tokens": 1000, "ignore_eos": True},
                   headers={"Authorization": f"Bearer {KEY}"})
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and _series(server, aborted) < before + 1:
        time.sleep(0.2)
    assert _series(server, aborted) == before + 1
    while time.monotonic() < deadline and metric(server, "tamis:num_requests_running") > 0:
        time.sleep(0.2)
    assert metric(server, "tamis:num_requests_running") == 0


def test_metrics_counters_move(server, client):
    names = ["tamis:prompt_tokens_total", "tamis:generation_tokens_total",
             "tamis:e2e_request_latency_seconds_count", "tamis:time_to_first_token_seconds_count",
             "tamis:request_queue_time_seconds_count", "tamis:prefix_cache_queries_total"]
    before = {n: metric(server, n) for n in names}
    client.completions.create(model="smol", prompt="Counting: one two", max_tokens=4,
                              extra_body={"ignore_eos": True})
    after = {n: metric(server, n) for n in names}
    for n in names:
        assert after[n] > before[n], n
    assert after["tamis:generation_tokens_total"] - before["tamis:generation_tokens_total"] == 4
    text = httpx.get(server + "/metrics").text
    assert 'model_name="smol"' in text
    assert "tamis:kv_cache_usage_perc" in text and "tamis:structured_output_requests_total" in text
