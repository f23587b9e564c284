"""LangChain (langchain-openai's ChatOpenAI) against a live ``tamis serve``: structured
output through both of its methods and tool calling. The tiny model's answers are not smart;
what must hold is that every constrained answer parses and validates against the schema
the client sent (response_format json_schema, or tools with a tool_choice)."""
from __future__ import annotations

import json

import jsonschema
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.utils.function_calling import convert_to_openai_tool

from .client_setup import PROMPT, City, get_weather


def _parameters(tool, strict: bool | None = None) -> dict:
    """The JSON schema LangChain sends as the tool's parameters."""
    return convert_to_openai_tool(tool, strict=strict)["function"]["parameters"]


def test_structured_output_json_schema(chat_model):
    structured = chat_model.with_structured_output(City, method="json_schema", include_raw=True)
    result = structured.invoke(PROMPT)
    assert result["parsing_error"] is None
    assert isinstance(result["parsed"], City)
    jsonschema.validate(json.loads(result["raw"].content), City.model_json_schema())


def test_structured_output_function_calling(chat_model):
    structured = chat_model.with_structured_output(City, method="function_calling", strict=True,
                                                   include_raw=True)
    result = structured.invoke(PROMPT)
    assert result["parsing_error"] is None
    assert isinstance(result["parsed"], City)
    [call] = result["raw"].tool_calls
    assert call["name"] == "City"
    jsonschema.validate(call["args"], _parameters(City, strict=True))


def test_bind_tools_named_choice(chat_model):
    reply = chat_model.bind_tools([get_weather], tool_choice="get_weather", strict=True).invoke(
        "What is the weather in Paris?")
    assert not reply.invalid_tool_calls
    [call] = reply.tool_calls
    assert call["name"] == "get_weather"
    jsonschema.validate(call["args"], _parameters(get_weather, strict=True))


def test_bind_tools_any_of_two(chat_model):
    """tool_choice="any" (OpenAI's "required"): one call or more, each to a bound tool with
    arguments valid for that tool (LangChain's default, non-strict schemas)."""
    tools = {"get_weather": get_weather, "City": City}
    reply = chat_model.bind_tools(list(tools.values()), tool_choice="any").invoke(
        "Lyon is in France. What is the weather there?")
    assert not reply.invalid_tool_calls
    assert reply.tool_calls
    for call in reply.tool_calls:
        jsonschema.validate(call["args"], _parameters(tools[call["name"]]))


def test_tool_result_goes_back_to_the_model(chat_model):
    """The agent loop: the assistant's tool calls and the tool's answer are sent back in
    LangChain's message shapes (assistant content null + tool_calls, role tool)."""
    messages = [HumanMessage("What is the weather in Paris?")]
    reply = chat_model.bind_tools([get_weather], tool_choice="required").invoke(messages)
    assert reply.tool_calls
    messages.append(reply)
    for call in reply.tool_calls:
        messages.append(ToolMessage(get_weather(**call["args"]), tool_call_id=call["id"]))
    final = chat_model.invoke(messages)
    assert isinstance(final.content, str) and final.content
    assert not final.tool_calls
    assert final.response_metadata["finish_reason"] in ("stop", "length")
