"""Structured outputs from `tamis serve` with the official OpenAI client.

Start a server (the embedded SmolLM2 when no model is given), then run this file:

    tamis serve --api-key sk-local &
    python examples/openai_client_structured.py --api-key sk-local

`structured_outputs` travels in `extra_body` (the same field vLLM reads); the legacy
`guided_*` fields are refused with a 400 that names the replacement.
"""
from __future__ import annotations

import argparse
import json

from openai import OpenAI
from pydantic import BaseModel, Field


class Pet(BaseModel):
    # Bounded fields: a small model may otherwise ramble inside a string until max_tokens.
    name: str = Field(max_length=16)
    species: str = Field(max_length=16)
    legs: int = Field(ge=0, le=8)


WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object",
                   "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--api-key", default="EMPTY")
    args = parser.parse_args()
    client = OpenAI(base_url=args.base_url, api_key=args.api_key)
    model = client.models.list().data[0].id

    def ask(content: str, **kwargs):
        return client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": content}], max_tokens=120,
            **kwargs).choices[0].message

    print("choice:", ask("Is the sky blue?", extra_body={
        "structured_outputs": {"choice": ["yes", "no"]}}).content)
    print("regex: ", ask("Give a date.", extra_body={
        "structured_outputs": {"regex": r"20\d\d-[01]\d-[0-3]\d"}}).content)
    print("json:  ", ask("Describe a pet.", extra_body={
        "structured_outputs": {"json": {**Pet.model_json_schema(),
                                        "additionalProperties": False}}}).content)
    grammar = 'root ::= expr\nexpr ::= term (("+" | "-") term)*\nterm ::= [0-9]+'
    print("grammar:", ask("Write an arithmetic sum.", extra_body={
        "structured_outputs": {"grammar": grammar}}).content)

    parsed = client.chat.completions.parse(
        model=model, messages=[{"role": "user", "content": "Describe a pet."}],
        max_tokens=120, response_format=Pet)
    print("parse: ", repr(parsed.choices[0].message.parsed))

    call = ask("What is the weather in Paris?", tools=[WEATHER_TOOL],
               tool_choice={"type": "function", "function": {"name": "get_weather"}})
    tool_call = call.tool_calls[0]
    print("tool:  ", tool_call.function.name, json.loads(tool_call.function.arguments))


if __name__ == "__main__":
    main()
