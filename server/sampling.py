"""Request body -> ``SamplingParams`` and the prompt the engine gets, with vLLM's server
defaults.

``max_tokens`` left unset means "until the context is full" for chat and 16 for
completions (OpenAI's default). A prompt plus ``max_tokens`` past the model's context is
a 400 naming both numbers, as vLLM answers. ``SamplingParams`` validates the values
itself; its ``ValueError`` becomes a 400 whose ``param`` is the field it names.
"""
from __future__ import annotations

import re

from tamis.server.errors import invalid

# Request field -> SamplingParams field, copied when the request sets them.
_PASSTHROUGH = ("n", "best_of", "temperature", "top_p", "top_k", "min_p", "seed",
                "presence_penalty", "frequency_penalty", "repetition_penalty",
                "stop_token_ids", "include_stop_str_in_output", "ignore_eos", "min_tokens",
                "skip_special_tokens", "spaces_between_special_tokens", "allowed_token_ids",
                "prompt_logprobs", "bad_words")


def max_tokens_for(request_max: int | None, prompt_len: int, max_model_len: int,
                   param: str = "max_tokens", prompt_param: str = "prompt") -> int:
    """The output budget; 400 if the prompt (``prompt_param``: "prompt", or "messages" for
    chat) or the requested budget does not fit."""
    if prompt_len >= max_model_len:
        raise invalid(f"This model's maximum context length is {max_model_len} tokens, "
                      f"but the prompt has {prompt_len} tokens. Please shorten the prompt.",
                      prompt_param)
    tokens_left = max_model_len - prompt_len
    if request_max is None:
        return tokens_left
    if request_max < 1:
        raise invalid(f"{param} must be at least 1, got {request_max}", param)
    if request_max > tokens_left:
        raise invalid(f"'{param}' is too large: {request_max}. This model's maximum context "
                      f"length is {max_model_len} tokens and your request has {prompt_len} "
                      f"input tokens ({request_max} > {max_model_len} - {prompt_len}).", param)
    return request_max


def truncate_prompt(ids: list[int], request, budget: int | None, max_model_len: int) -> list[int]:
    """The prompt ids ``truncate_prompt_tokens`` (k) keeps, as vLLM: the last k
    (``truncation_side`` "left", the default) or the first k ("right"); -1 keeps as many as
    fit beside the output budget (``budget``, None = unset). 400 when k cannot fit."""
    k = request.truncate_prompt_tokens
    if k is None:
        return ids
    room = max(max_model_len - (budget or 1), 1)
    if k == -1:
        k = room
    elif k == 0:
        raise invalid("truncate_prompt_tokens must be -1 (as many as fit) or at least 1",
                      "truncate_prompt_tokens")
    elif k > room:
        raise invalid(f"truncate_prompt_tokens={k} cannot be greater than the maximum context "
                      f"length {max_model_len} minus the output budget ({room} tokens left); "
                      f"request a smaller truncation size", "truncate_prompt_tokens")
    if len(ids) <= k:
        return ids
    return ids[:k] if request.truncation_side == "right" else ids[-k:]


def engine_prompt(ids: list[int], request):
    """The engine's prompt: the ids, with the request's ``cache_salt`` when it has one."""
    if request.cache_salt is None:
        return ids
    return {"prompt_token_ids": ids, "cache_salt": request.cache_salt}


def check_stream_options(request) -> None:
    if request.stream_options is not None and not request.stream:
        raise invalid("stream_options can only be set when stream is true", "stream_options")
    if request.stream and request.prompt_logprobs is not None:
        raise invalid("prompt_logprobs are not available when stream is true (as in vLLM); "
                      "send a non-streaming request", "prompt_logprobs")


def build_sampling_params(request, *, max_tokens: int, logprobs: int | None,
                          structured_outputs, default_temperature: float = 1.0):
    from tamis.engine.sampling_params import SamplingParams

    kwargs = {"max_tokens": max_tokens, "logprobs": logprobs,
              "structured_outputs": structured_outputs}
    for name in _PASSTHROUGH:
        value = getattr(request, name, None)
        if value is not None:
            kwargs[name] = value
    if request.temperature is None:
        kwargs["temperature"] = default_temperature
    if request.stop is not None:
        kwargs["stop"] = [request.stop] if isinstance(request.stop, str) else list(request.stop)
    if request.logit_bias:
        kwargs["logit_bias"] = _logit_bias(request.logit_bias)
    try:
        return SamplingParams(**kwargs)
    except TypeError as exc:
        raise invalid(f"unsupported sampling parameter: {exc}") from exc
    except ValueError as exc:
        raise invalid(str(exc), _field_named_in(str(exc), kwargs)) from exc


def _logit_bias(raw: dict[str, float]) -> dict[int, float]:
    try:
        return {int(token): float(bias) for token, bias in raw.items()}
    except ValueError as exc:
        raise invalid("logit_bias keys must be token ids (integers as strings)",
                      "logit_bias") from exc


def _field_named_in(message: str, kwargs: dict) -> str | None:
    for name in sorted(kwargs, key=len, reverse=True):
        if re.search(rf"\b{re.escape(name)}\b", message):
            return name
    return None
