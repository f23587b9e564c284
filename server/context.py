"""What every handler needs: the engine, its tokenizer and the served names."""
from __future__ import annotations

import asyncio
import functools
import time
import uuid
from dataclasses import dataclass, field

from tamis.server.errors import APIError, invalid
from tamis.server.logprobs import TokenText


@dataclass
class ServerContext:
    engine: object                 # tamis.engine.async_engine.AsyncEngine
    tokenizer: object
    model_names: list[str]         # the first one is reported in responses
    max_model_len: int
    max_logprobs: int = 20
    metrics: object = None         # tamis.server.metrics.ServerMetrics
    scheduling_policy: str = "fcfs"            # the engine's; "priority" honours `priority`
    reject_unknown_fields: bool = False        # --reject-unknown-fields
    trust_request_chat_template: bool = False  # --trust-request-chat-template
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self):
        self.token_text = TokenText(self.tokenizer)

    @property
    def model_name(self) -> str:
        return self.model_names[0]

    def check_model(self, model: str | None) -> str:
        """The name to report; 404 when the request names a model not served here."""
        if model is None or model in self.model_names:
            return model or self.model_name
        raise APIError(f"The model `{model}` does not exist. Served models: "
                       f"{', '.join(self.model_names)}", 404, param="model",
                       code="model_not_found")

    def check_logprobs(self, value: int | None, param: str) -> None:
        if value is not None and not 0 <= value <= self.max_logprobs:
            raise invalid(f"{param} must be between 0 and {self.max_logprobs} "
                          f"(--max-logprobs), got {value}", param)

    async def encode(self, text: str, param: str, truncated: bool = False,
                     **kwargs) -> list[int]:
        """``text``'s token ids, tokenized off the event loop (a long prompt takes seconds);
        400 naming ``param`` when it cannot fit the context, decided first from its length
        where that alone proves it (no token spans more than ``max_token_chars`` characters).
        ``truncated``: the caller keeps only part of the ids, so any length may fit."""
        if not truncated and len(text) > self.max_model_len * self.max_token_chars:
            raise invalid(f"{param} is too long: {len(text):,} characters cannot fit this "
                          f"model's maximum context length of {self.max_model_len} tokens", param)
        return await asyncio.to_thread(self.tokenizer.encode, text, **kwargs)

    @functools.cached_property
    def max_token_chars(self) -> int:
        """The most characters one token's text can hold (its vocabulary form, whose every
        character stands for at least one character of text)."""
        return max((len(token) for token in self.tokenizer.get_vocab()), default=1)

    def check_token_ids(self, ids: list[int], param: str) -> None:
        vocab = len(self.tokenizer)
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise invalid(f"{param} holds token ids outside the vocabulary [0, {vocab}): "
                          f"{bad[:5]}", param)


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"
