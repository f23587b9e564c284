"""Streaming consumers against a live ``tamis serve``: a bare SSE reader over httpx (what
any non-Python client does) and LangChain's ``stream`` / ``astream``. The pieces must add
up to an answer that validates against the schema the request carried."""
from __future__ import annotations

import asyncio
import json

import httpx
import jsonschema
import pytest
from langchain_core.utils.function_calling import convert_to_openai_tool
from live_server import MODEL_NAME

from .client_setup import KEY, MAX_TOKENS, PROMPT, City, get_weather

CITY_FORMAT = {"type": "json_schema",
               "json_schema": {"name": "City", "strict": True,
                               "schema": {**City.model_json_schema(),
                                          "additionalProperties": False}}}


def _sse_events(server: str, body: dict) -> list[dict]:
    """POSTs a streaming chat request; returns the decoded ``data:`` events up to
    ``[DONE]`` (which must come, last)."""
    events, done = [], False
    with httpx.stream("POST", server + "/v1/chat/completions", json=body, timeout=120,
                      headers={"Authorization": f"Bearer {KEY}"}) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if not line.startswith("data: "):
                assert line == "", line   # SSE: events are separated by blank lines
                continue
            assert not done, "an event after [DONE]"
            if line == "data: [DONE]":
                done = True
            else:
                events.append(json.loads(line[len("data: "):]))
    assert done, "the stream ended without [DONE]"
    return events


def test_sse_json_schema_stream(server):
    events = _sse_events(server, {
        "model": MODEL_NAME, "stream": True, "stream_options": {"include_usage": True},
        "max_tokens": MAX_TOKENS, "temperature": 0, "response_format": CITY_FORMAT,
        "messages": [{"role": "user", "content": PROMPT}]})
    *chunks, usage = events
    deltas = [c["choices"][0]["delta"].get("content") or "" for c in chunks]
    assert sum(1 for d in deltas if d) > 1, "the answer came in one piece, not streamed"
    City.model_validate_json("".join(deltas))
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] >= len(
        [d for d in deltas if d])


def test_langchain_stream_tool_call(chat_model):
    """Streamed tool-call chunks (name first, then argument pieces) merge into one call."""
    bound = chat_model.bind_tools([get_weather], tool_choice="get_weather", strict=True)
    merged, num_chunks = None, 0
    for chunk in bound.stream("What is the weather in Paris?"):
        merged = chunk if merged is None else merged + chunk
        num_chunks += bool(chunk.tool_call_chunks)
    assert num_chunks > 1
    assert not merged.invalid_tool_calls
    [call] = merged.tool_calls
    assert call["name"] == "get_weather"
    jsonschema.validate(call["args"],
                        convert_to_openai_tool(get_weather, strict=True)["function"]["parameters"])


# langchain-openai dumps openai's parsed chunk through a model typed `parsed: None`.
@pytest.mark.filterwarnings("ignore:Pydantic serializer warnings:UserWarning")
def test_langchain_astream_structured_concurrently(chat_model):
    """Two structured streams at once, as an async app would run them."""
    structured = chat_model.with_structured_output(City, method="json_schema")

    async def last_chunk(prompt: str):
        parts = [part async for part in structured.astream(prompt)]
        return parts[-1]

    async def both():
        return await asyncio.gather(last_chunk(PROMPT), last_chunk("Osaka is a city in Japan."))

    for city in asyncio.run(both()):
        assert isinstance(city, City)
