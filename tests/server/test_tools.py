"""Tool plans, the Hermes/SmolLM2 `<tool_call>` parser and streamed tool deltas."""
from __future__ import annotations

import json

import jsonschema
import pytest

from tamis.server.errors import APIError
from tamis.server.protocol import ChatTool
from tamis.server.tools import ToolStreamer, extract_tool_calls, parse_hermes, plan_tools

WEATHER = ChatTool.model_validate({"type": "function", "function": {
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}})
TIME = ChatTool.model_validate({"type": "function", "function": {"name": "get_time"}})


def test_plans_follow_tool_choice():
    assert plan_tools(None, None).mode == "none"
    assert plan_tools([WEATHER], None).mode == "auto"
    assert plan_tools([WEATHER], "none").mode == "none"
    named = plan_tools([WEATHER, TIME], {"type": "function", "function": {"name": "get_weather"}})
    assert named.mode == "named" and named.schema == WEATHER.function.parameters
    required = plan_tools([WEATHER, TIME], "required", parallel_tool_calls=False)
    assert required.schema["maxItems"] == 1 and len(required.schema["items"]["anyOf"]) == 2
    good = [{"name": "get_weather", "parameters": {"city": "Oslo"}},]
    jsonschema.validate(good, required.schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([{"name": "get_weather", "parameters": {}}], required.schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([], required.schema)


@pytest.mark.parametrize("tools,choice,param", [
    (None, "required", "tool_choice"),
    ([WEATHER], {"type": "function", "function": {"name": "missing"}}, "tool_choice"),
    ([WEATHER], {"type": "function"}, "tool_choice"),
])
def test_bad_tool_choice_is_400(tools, choice, param):
    with pytest.raises(APIError) as info:
        plan_tools(tools, choice)
    assert info.value.status == 400 and info.value.param == param


def test_parse_hermes_calls_and_content():
    text = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}'
            '\n</tool_call>\n<tool_call>{"name": "get_time", "arguments": {}}</tool_call>')
    content, calls = parse_hermes(text)
    assert content == "Let me check."
    assert [c["function"]["name"] for c in calls] == ["get_weather", "get_time"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Oslo"}
    assert calls[0]["id"] != calls[1]["id"]


def test_parse_hermes_keeps_broken_blocks_as_content():
    text = "<tool_call>{not json}</tool_call>"
    assert parse_hermes(text) == (text, [])
    assert parse_hermes("plain answer") == ("plain answer", [])
    # An unterminated block at the end (max_tokens hit after the JSON) still parses.
    _, calls = parse_hermes('<tool_call>{"name": "get_time", "arguments": {}}')
    assert calls[0]["function"]["name"] == "get_time"


def test_extract_for_each_mode():
    named = plan_tools([WEATHER], {"type": "function", "function": {"name": "get_weather"}})
    content, calls = extract_tool_calls(named, '{"city": "Rome"}')
    assert content is None and calls[0]["function"]["arguments"] == '{"city": "Rome"}'
    required = plan_tools([WEATHER], "required")
    _, calls = extract_tool_calls(required, '[{"name": "get_weather", "parameters": {"city": "A"}}]')
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "A"}
    auto_single = plan_tools([WEATHER], "auto", parallel_tool_calls=False)
    two = ('<tool_call>{"name": "get_weather", "arguments": {"city": "A"}}</tool_call>'
           '<tool_call>{"name": "get_weather", "arguments": {"city": "B"}}</tool_call>')
    assert len(extract_tool_calls(auto_single, two)[1]) == 1


def _stream(plan, pieces):
    streamer = ToolStreamer(plan)
    deltas = []
    for piece in pieces:
        deltas += streamer.feed(piece)
    return deltas + streamer.finish(), streamer


def test_auto_stream_holds_back_a_partial_tag_and_emits_whole_calls():
    plan = plan_tools([WEATHER], "auto")
    pieces = ["Sure", ". <tool", "_call>", '{"name": "get_weather", ', '"arguments": {"city": "X"}}',
              "</tool_call>"]
    deltas, streamer = _stream(plan, pieces)
    content = "".join(d.get("content", "") for d in deltas)
    assert content.strip() == "Sure."
    calls = [c for d in deltas for c in d.get("tool_calls", [])]
    assert len(calls) == 1 and calls[0]["index"] == 0
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "X"}
    assert streamer.emitted_calls


def test_auto_stream_plain_text_passes_through_including_lookalikes():
    plan = plan_tools([WEATHER], "auto")
    deltas, streamer = _stream(plan, ["a <", "b> <tool", " c"])
    assert "".join(d["content"] for d in deltas) == "a <b> <tool c"
    assert not streamer.emitted_calls


def test_named_stream_sends_name_once_then_argument_pieces():
    plan = plan_tools([WEATHER], {"type": "function", "function": {"name": "get_weather"}})
    deltas, _ = _stream(plan, ['{"city"', ': "Oslo"', "}"])
    first = deltas[0]["tool_calls"][0]
    assert first["function"]["name"] == "get_weather" and first["id"].startswith("call_")
    assert all("name" not in d["tool_calls"][0]["function"] for d in deltas[1:])
    args = "".join(d["tool_calls"][0]["function"]["arguments"] for d in deltas)
    assert json.loads(args) == {"city": "Oslo"}
