"""Engine logprobs -> OpenAI's two logprobs shapes.

The engine gives, per generated position, a mapping ``token_id -> Logprob`` (an object
with ``.logprob``, as vLLM's) or ``token_id -> float`` holding the sampled token and the
top-k alternatives. Chat wants ``{"content": [{token, logprob, bytes, top_logprobs}],
"refusal": None}``; completions want parallel lists ``tokens``, ``token_logprobs``,
``top_logprobs`` (dicts), ``text_offset``. ``prompt_logprobs`` (vLLM's field) is a list
holding None for the first prompt token, then ``{token_id: {logprob, rank,
decoded_token}}`` per prompt position. With ``return_tokens_as_token_ids`` every token's
text is written ``token_id:{id}`` (``token_id_text``), as vLLM does, so tokens that are
not valid UTF-8 on their own can still be told apart.
"""
from __future__ import annotations

import functools
import math


def _value(entry) -> float:
    value = float(getattr(entry, "logprob", entry))
    return -9999.0 if math.isinf(value) or math.isnan(value) else value


def _ranked(position: dict) -> list[tuple[int, float]]:
    return sorted(((int(t), _value(v)) for t, v in position.items()), key=lambda p: -p[1])


class TokenText:
    """Cached ``token_id -> str`` for one tokenizer (one decode per distinct id)."""

    def __init__(self, tokenizer):
        self._decode = functools.lru_cache(maxsize=65536)(
            lambda token_id: tokenizer.decode([token_id]))

    def __call__(self, token_id: int) -> str:
        return self._decode(int(token_id))


def token_id_text(token_id: int) -> str:
    return f"token_id:{int(token_id)}"


def prompt_logprobs_json(positions, token_text) -> list[dict | None] | None:
    """The engine's prompt logprobs as vLLM's JSON (token ids as keys)."""
    if positions is None:
        return None
    return [None if position is None else
            {str(t): {"logprob": _value(entry), "rank": getattr(entry, "rank", None),
                      "decoded_token": token_text(t)} for t, entry in position.items()}
            for position in positions]


def _chat_token(text: str, logprob: float) -> dict:
    return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}


def chat_logprobs(token_ids, positions, top_n: int, token_text: TokenText) -> dict:
    """Chat ``logprobs`` for ``token_ids`` (sampled) and their logprob ``positions``."""
    content = []
    for token_id, position in zip(token_ids, positions):
        ranked = _ranked(position or {})
        sampled = _value(position[token_id]) if position and token_id in position else -9999.0
        item = _chat_token(token_text(token_id), sampled)
        item["top_logprobs"] = [_chat_token(token_text(t), lp) for t, lp in ranked[:top_n]]
        content.append(item)
    return {"content": content, "refusal": None}


def completion_logprobs(token_ids, positions, top_n: int, token_text: TokenText,
                        text_offset: int = 0) -> dict:
    """Completions ``logprobs``; ``text_offset`` is where the first token's text starts."""
    tokens, token_logprobs, top_logprobs, offsets = [], [], [], []
    for token_id, position in zip(token_ids, positions):
        text = token_text(token_id)
        tokens.append(text)
        offsets.append(text_offset)
        text_offset += len(text)
        if position is None:  # the first prompt token has no logprob
            token_logprobs.append(None)
            top_logprobs.append(None)
            continue
        token_logprobs.append(_value(position[token_id]) if token_id in position else -9999.0)
        top = {}
        for t, lp in _ranked(position)[:top_n]:
            top.setdefault(token_text(t), lp)
        top_logprobs.append(top)
    return {"tokens": tokens, "token_logprobs": token_logprobs,
            "top_logprobs": top_logprobs, "text_offset": offsets}
