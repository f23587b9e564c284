"""Request bodies of the OpenAI-compatible API, with OpenAI's field names.

Unknown fields are kept (``extra="allow"``), as vLLM does, so clients that send
provider-specific extras still work; ``server.fields`` warns about them once per name,
refuses them under ``--reject-unknown-fields``, and always refuses near-misses of known
names and the fields this server does not serve. The legacy ``guided_*`` extras are
refused by ``server.structured`` with the ``structured_outputs`` field to use.
Response bodies are plain dicts built in ``server.responses`` and checked by the tests
against OpenAI's OpenAPI schemas.
"""
from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

_SURROGATE = re.compile("[\ud800-\udfff]")


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")


class _RequestBody(_Body):
    """A whole request body: checked once here, nested parts with it."""

    @model_validator(mode="before")
    @classmethod
    def _no_lone_surrogates(cls, data: Any) -> Any:
        """JSON's ``"\\ud800"`` escape decodes to a lone UTF-16 surrogate, which no text
        encoding can carry (the tokenizer and the response would fail on it)."""
        where = _surrogate_path(data, "")
        if where is not None:
            raise ValueError(f"{where or 'the body'} holds a lone UTF-16 surrogate "
                             f"(an unpaired \\ud800-\\udfff escape)")
        return data


def _surrogate_path(value: Any, path: str) -> str | None:
    """The dotted path of the first string (or key) holding a lone surrogate, or None."""
    if isinstance(value, str):
        return path if _SURROGATE.search(value) else None
    if isinstance(value, dict):
        for key, item in value.items():
            inner = f"{path}.{key}" if path else str(key)
            if isinstance(key, str) and _SURROGATE.search(key):
                return inner
            found = _surrogate_path(item, inner)
            if found is not None:
                return found
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found = _surrogate_path(item, f"{path}.{index}" if path else str(index))
            if found is not None:
                return found
    return None


class StreamOptions(_Body):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class JsonSchemaFormat(_Body):
    name: str = "response"
    description: str | None = None
    schema_: dict[str, Any] | bool | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Body):
    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: JsonSchemaFormat | None = None


class SamplingFields(_RequestBody):
    """Fields shared by both endpoints: OpenAI's, then vLLM's extras."""
    model: str | None = None
    n: int = 1
    best_of: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    frequency_penalty: float | None = 0.0
    presence_penalty: float | None = 0.0
    logit_bias: dict[str, float] | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    response_format: ResponseFormat | None = None
    # vLLM extras
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    min_tokens: int = 0
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    allowed_token_ids: list[int] | None = None
    prompt_logprobs: int | None = None
    structured_outputs: dict[str, Any] | None = None
    priority: int = 0
    request_id: str | None = None
    use_beam_search: bool = False     # n is the beam width (server.beam)
    length_penalty: float = 1.0
    bad_words: list[str] | None = None
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1)
    truncation_side: Literal["left", "right"] | None = None
    cache_salt: str | None = Field(default=None, min_length=1)
    return_token_ids: bool | None = None
    return_tokens_as_token_ids: bool | None = None


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = 16
    logprobs: int | None = None
    suffix: str | None = None
    echo: bool = False
    add_special_tokens: bool = True


class ChatMessage(_Body):
    role: str
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


class FunctionDefinition(_Body):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ChatTool(_Body):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[ChatTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    # vLLM extras
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    echo: bool = False
    # OpenAI's legacy function calling, served as tools (server.tools.legacy_functions)
    functions: list[FunctionDefinition] | None = Field(default=None, min_length=1)
    function_call: Literal["none", "auto"] | dict[str, Any] | None = None


class TokenizeRequest(_RequestBody):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True


class DetokenizeRequest(_RequestBody):
    model: str | None = None
    tokens: list[int]
