"""The JSON body or the SSE chunks of one chat completion.

Beside OpenAI's fields a response carries vLLM's, when asked: ``prompt_logprobs`` and
``prompt_token_ids`` (top level; streamed in the first chunk) and each choice's
``token_ids`` (``return_token_ids``; the new ids of each chunk when streaming). A request
that used the legacy ``functions`` gets ``function_call`` where tools give ``tool_calls``.
"""
from __future__ import annotations

import time

from tamis.server.logprobs import chat_logprobs, prompt_logprobs_json, token_id_text
from tamis.server.streaming import Cursor, sse, sse_body
from tamis.server.tools import ToolPlan, ToolStreamer, as_function_call, extract_tool_calls


class ChatWriter:
    """``response(final_output)`` for a JSON answer, ``stream(generations)`` for SSE."""

    def __init__(self, ctx, body, model: str, response_id: str, plan: ToolPlan,
                 prompt_ids: list[int], raw, legacy: bool = False, echo: str = ""):
        self.ctx, self.body, self.model, self.response_id = ctx, body, model, response_id
        self.plan, self.prompt_ids, self.raw = plan, prompt_ids, raw
        self.legacy, self.echo = legacy, echo
        self.created = int(time.time())
        self.top_n = body.top_logprobs or 0
        self.token_text = token_id_text if body.return_tokens_as_token_ids else ctx.token_text

    def _finish_reason(self, choice, made_calls: bool) -> str:
        if made_calls and choice.finish_reason == "stop" and self.plan.mode != "named":
            return "function_call" if self.legacy else "tool_calls"
        return choice.finish_reason

    def _logprobs(self, choice, start: int = 0):
        if not self.body.logprobs:
            return None
        return chat_logprobs(choice.token_ids[start:], (choice.logprobs or [])[start:],
                             self.top_n, self.token_text)

    def usage(self, output) -> dict:
        prompt_len = len(self.prompt_ids)
        completion = sum(len(c.token_ids) for c in output.outputs) if output else 0
        usage = {"prompt_tokens": prompt_len, "completion_tokens": completion,
                 "total_tokens": prompt_len + completion}
        self.raw.scope.setdefault("state", {})["usage"] = usage
        return usage

    def _envelope(self, choices, object_="chat.completion.chunk") -> dict:
        return {"id": self.response_id, "object": object_, "created": self.created,
                "model": self.model, "choices": choices}

    def _calls_field(self, calls: list[dict]) -> dict:
        if not calls:
            return {}
        return {"function_call": as_function_call(calls)} if self.legacy else {"tool_calls": calls}

    def response(self, output) -> dict:
        choices = []
        for choice in output.outputs:
            content, calls = extract_tool_calls(self.plan, choice.text)
            if self.echo:
                content = self.echo + (content or "")
            message = {"role": "assistant", "content": content, "refusal": None,
                       **self._calls_field(calls)}
            entry = {"index": choice.index, "message": message,
                     "logprobs": self._logprobs(choice),
                     "finish_reason": self._finish_reason(choice, bool(calls)),
                     "stop_reason": choice.stop_reason}
            if self.body.return_token_ids:
                entry["token_ids"] = list(choice.token_ids)
            choices.append(entry)
        body = self._envelope(choices, "chat.completion")
        body["usage"] = self.usage(output)
        if self.body.prompt_logprobs is not None:
            body["prompt_logprobs"] = prompt_logprobs_json(output.prompt_logprobs,
                                                           self.token_text)
        if self.body.return_token_ids:
            body["prompt_token_ids"] = list(self.prompt_ids)
        return body

    def _chunk(self, choices, output=None) -> dict:
        chunk = self._envelope(choices)
        if self._include_usage:
            options = self.body.stream_options
            chunk["usage"] = (self.usage(output) if options.continuous_usage_stats
                              and output is not None else None)
        return chunk

    @property
    def _include_usage(self) -> bool:
        options = self.body.stream_options
        return options is not None and options.include_usage

    def _opening_chunks(self) -> list[dict]:
        """The role of every choice (with ``prompt_token_ids`` when asked), then the echoed
        text, as vLLM sends them."""
        n = self.body.n
        first = self._chunk([{"index": i, "delta": {"role": "assistant", "content": ""},
                              "logprobs": None, "finish_reason": None} for i in range(n)])
        if self.body.return_token_ids:
            first["prompt_token_ids"] = list(self.prompt_ids)
        if not self.echo:
            return [first]
        return [first, self._chunk([{"index": i, "delta": {"content": self.echo},
                                     "logprobs": None, "finish_reason": None}
                                    for i in range(n)])]

    async def stream(self, gens):
        for chunk in self._opening_chunks():
            yield sse(chunk)
        n = self.body.n
        cursors = [Cursor() for _ in range(n)]
        streamers = [ToolStreamer(self.plan) for _ in range(n)]
        latest = [None]

        def chunks(_, output):
            latest[0] = output
            choices = []
            for choice in output.outputs:
                choices += self._deltas(choice, cursors[choice.index], streamers[choice.index])
            return [self._chunk(choices, output)] if choices else []

        def closing_chunk():
            usage = self.usage(latest[0])   # also recorded for the access log
            return {**self._envelope([]), "usage": usage} if self._include_usage else None

        async for line in sse_body(gens, chunks, closing_chunk):
            yield line

    def _deltas(self, choice, cursor: Cursor, streamer: ToolStreamer) -> list[dict]:
        """At most one entry for this choice: its new content / tool calls, logprobs,
        and the finish reason once it is done."""
        if cursor.done or not cursor.has_news(choice):
            return []
        logprobs = self._logprobs(choice, cursor.tokens)
        new_ids = list(choice.token_ids[cursor.tokens:])
        parts = streamer.feed(cursor.advance(choice))
        finish = None
        if cursor.done:
            parts += streamer.finish()
            finish = self._finish_reason(choice, streamer.emitted_calls)
        delta = _merge_parts(parts, self.legacy)
        if (not delta and not finish and not (logprobs and logprobs["content"])
                and not (new_ids and self.body.return_token_ids)):
            return []
        entry = {"index": choice.index, "delta": delta, "logprobs": logprobs,
                 "finish_reason": finish}
        if finish is not None:
            entry["stop_reason"] = choice.stop_reason
        if self.body.return_token_ids:
            entry["token_ids"] = new_ids
        return [entry]


def _merge_parts(parts: list[dict], legacy: bool) -> dict:
    delta: dict = {}
    for part in parts:
        if "content" in part:
            delta["content"] = delta.get("content", "") + part["content"]
        if "tool_calls" in part:
            delta.setdefault("tool_calls", []).extend(part["tool_calls"])
    if legacy and "tool_calls" in delta:
        delta["function_call"] = _legacy_delta(delta.pop("tool_calls"))
    return delta


def _legacy_delta(calls: list[dict]) -> dict:
    """Streamed tool-call pieces of the first call as one ``function_call`` delta."""
    function: dict = {}
    for call in calls:
        if call.get("index", 0) != 0:
            continue
        piece = call.get("function") or {}
        if "name" in piece:
            function["name"] = piece["name"]
        function["arguments"] = function.get("arguments", "") + piece.get("arguments", "")
    return function
