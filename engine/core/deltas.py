"""Outputs across the process boundary: deltas down the wire, cumulative outputs rebuilt.

A request the server wants cumulative outputs for is sent to the core process as
``RequestOutputKind.DELTA`` (``delta_params``): each step then carries only its new token
ids, text and logprobs, so a step's message grows with the batch, not with the length of
the outputs. ``OutputPacker`` (core side) also drops what the server already holds: the
prompt and its ids after the first output, and prompt logprobs that did not change.
``OutputMerger`` (server side, one per request) adds the deltas up into the
``RequestOutput`` values the in-process engine would have returned::

    core:   out1 = {ids [a],    text "A",  prompt ids [p..]}   out2 = {ids [b], text "B"}
    server: cum1 = {ids [a],    text "A",  prompt ids [p..]}   cum2 = {ids [a, b], text "AB",
                                                                       prompt ids [p..]}
"""
from __future__ import annotations

from typing import Any

from tamis.engine.outputs import CompletionOutput, RequestOutput
from tamis.engine.sampling_params import RequestOutputKind


def delta_params(params: Any) -> Any:
    """``params`` asking for deltas (a copy), when they ask for cumulative outputs; else
    ``params`` itself (DELTA and FINAL_ONLY outputs cross unchanged)."""
    if getattr(params, "output_kind", None) != RequestOutputKind.CUMULATIVE:
        return params
    twin = params.clone()
    twin.output_kind = RequestOutputKind.DELTA
    return twin


class OutputPacker:
    """Core side: strips from each output the parts its request already sent."""

    def __init__(self) -> None:
        self._prompt_logprobs_sent: dict[str, int] = {}   # request id -> entries sent

    def pack(self, outputs: list[RequestOutput]) -> list[RequestOutput]:
        for output in outputs:
            sent = self._prompt_logprobs_sent.get(output.request_id)
            num_prompt_logprobs = len(output.prompt_logprobs or ())
            if sent is not None:
                output.prompt = output.prompt_token_ids = None
                if num_prompt_logprobs == sent:
                    output.prompt_logprobs = None
            if output.finished:
                self._prompt_logprobs_sent.pop(output.request_id, None)
            else:
                self._prompt_logprobs_sent[output.request_id] = num_prompt_logprobs
        return outputs

    def forget(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            self._prompt_logprobs_sent.pop(request_id, None)


class OutputMerger:
    """Server side, one per request: turns its deltas into cumulative ``RequestOutput``s.

    Each returned output owns its lists (a consumer may keep an older one while newer
    ones arrive). A field the packer dropped (None) keeps its last value."""

    def __init__(self) -> None:
        self._prompt: str | None = None
        self._prompt_token_ids: list[int] = []
        self._prompt_logprobs = None
        self._choices: dict[int, _Choice] = {}

    def merge(self, delta: RequestOutput) -> RequestOutput:
        if delta.prompt_token_ids is not None:
            self._prompt, self._prompt_token_ids = delta.prompt, delta.prompt_token_ids
        if delta.prompt_logprobs is not None:
            self._prompt_logprobs = delta.prompt_logprobs
        for completion in delta.outputs:
            self._choices.setdefault(completion.index, _Choice(completion)).add(completion)
        return RequestOutput(
            request_id=delta.request_id, prompt=self._prompt,
            prompt_token_ids=self._prompt_token_ids, prompt_logprobs=self._prompt_logprobs,
            outputs=[self._choices[i].snapshot() for i in sorted(self._choices)],
            finished=delta.finished, metrics=delta.metrics, error=delta.error,
            num_cached_tokens=delta.num_cached_tokens, error_code=delta.error_code)


class _Choice:
    """One completion's text, ids and logprobs so far."""

    def __init__(self, first: CompletionOutput):
        self.index = first.index
        self.text_parts: list[str] = []
        self.token_ids: list[int] = []
        self.logprobs: list | None = [] if first.logprobs is not None else None
        self.last = first

    def add(self, delta: CompletionOutput) -> None:
        if delta.text:
            self.text_parts.append(delta.text)
        self.token_ids.extend(delta.token_ids)
        if delta.logprobs is not None and self.logprobs is not None:
            self.logprobs.extend(delta.logprobs)
        self.last = delta

    def snapshot(self) -> CompletionOutput:
        if len(self.text_parts) > 1:
            self.text_parts = ["".join(self.text_parts)]
        last = self.last
        return CompletionOutput(
            self.index, self.text_parts[0] if self.text_parts else "", list(self.token_ids),
            last.cumulative_logprob, list(self.logprobs) if self.logprobs is not None else None,
            last.finish_reason, last.stop_reason)


__all__ = ["OutputMerger", "OutputPacker", "delta_params"]
