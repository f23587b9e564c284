"""Outputs across the process boundary: token deltas down the wire, text and cumulative
outputs made on the server's side.

A request the server wants cumulative outputs for goes to the core process with
``core_params``: ``RequestOutputKind.DELTA`` (each step carries only its new token ids and
logprobs, so a step's message grows with the batch, not with the outputs' length) and, when
the server holds the tokenizer, no detokenization and no stop strings: the core only
appends ids (its fast path) and the server turns them into text with the same
``IncrementalDetokenizer`` the in-process engine uses. ``OutputPacker`` (core side) also
drops what the server already holds: the prompt and its ids after the first output, and
prompt logprobs that did not change. ``OutputMerger`` (server side, one per request) adds
the deltas up into the ``RequestOutput`` values the in-process engine would have returned::

    core:   out1 = {ids [a], prompt ids [p..]}        out2 = {ids [b]}
    server: cum1 = {ids [a], text "A", prompt ids}    cum2 = {ids [a, b], text "AB", prompt ids}

A stop string is found on the server's side: that choice ends there (its later ids are
dropped), and once every choice ended the server aborts the request in the core
(``OutputMerger.merge`` says so). The core may have sampled a token or two past the stop
meanwhile; they are never reported.
"""
from __future__ import annotations

from typing import Any

from tamis.engine.detokenizer import IncrementalDetokenizer
from tamis.engine.outputs import CompletionOutput, RequestOutput
from tamis.engine.sampling_params import RequestOutputKind


def wants_merging(params: Any) -> bool:
    """Whether a request's outputs are made cumulative on the server's side (the
    default kind); DELTA and FINAL_ONLY outputs cross unchanged."""
    return getattr(params, "output_kind", None) == RequestOutputKind.CUMULATIVE


def core_params(params: Any, detokenize_here: bool) -> Any:
    """A copy of cumulative ``params`` for the core: DELTA outputs, and with
    ``detokenize_here`` neither text nor stop strings (the server's merger does both)."""
    twin = params.clone()
    twin.output_kind = RequestOutputKind.DELTA
    if detokenize_here:
        twin.detokenize = False
        twin.stop = []
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

    ``tokenizer`` set: the text is made here from ``params`` (the request's own, with its
    stop strings), as ``core_params(params, detokenize_here=True)`` asked the core not to.
    Each returned output owns its lists (a consumer may keep an older one while newer ones
    arrive). A field the packer dropped (None) keeps its last value."""

    def __init__(self, params: Any, tokenizer: Any = None):
        self.params = params
        self.tokenizer = tokenizer
        self._prompt: str | None = None
        self._prompt_token_ids: list[int] = []
        self._prompt_logprobs = None
        self._choices: dict[int, _Choice] = {}

    def merge(self, delta: RequestOutput) -> RequestOutput:
        """The cumulative output after ``delta``. Its ``finished`` may be true before the
        core's (a stop string ended every choice): the caller then aborts the request."""
        if delta.prompt_token_ids is not None:
            self._prompt, self._prompt_token_ids = delta.prompt, delta.prompt_token_ids
        if delta.prompt_logprobs is not None:
            self._prompt_logprobs = delta.prompt_logprobs
        for completion in delta.outputs:
            choice = self._choices.get(completion.index)
            if choice is None:
                choice = self._choices[completion.index] = _Choice(
                    completion.index, self._detokenizer(), completion.logprobs is not None)
            choice.add(completion)
        choices = [self._choices[i] for i in sorted(self._choices)]
        return RequestOutput(
            request_id=delta.request_id, prompt=self._prompt,
            prompt_token_ids=self._prompt_token_ids, prompt_logprobs=self._prompt_logprobs,
            outputs=[choice.snapshot() for choice in choices],
            finished=delta.finished or all(choice.finish_reason for choice in choices),
            metrics=delta.metrics, error=delta.error,
            num_cached_tokens=delta.num_cached_tokens, error_code=delta.error_code)

    def _detokenizer(self) -> IncrementalDetokenizer | None:
        if self.tokenizer is None or not self.params.detokenize:
            return None
        return IncrementalDetokenizer(self.tokenizer, self._prompt_token_ids, self.params)


class _Choice:
    """One completion's ids, logprobs and text so far."""

    def __init__(self, index: int, detokenizer: IncrementalDetokenizer | None,
                 with_logprobs: bool):
        self.index = index
        self.detokenizer = detokenizer
        self.token_ids: list[int] = []
        self.logprobs: list | None = [] if with_logprobs else None
        self.text_parts: list[str] = []          # the core's text, without a detokenizer
        self.cumulative_logprob: float | None = None
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None

    def add(self, delta: CompletionOutput) -> None:
        if self.finish_reason is not None:
            return   # ended by a stop string here: the core's later ids are dropped
        keep, stop = self._detokenize(delta)
        self.token_ids.extend(delta.token_ids[:keep])
        if delta.logprobs is not None and self.logprobs is not None:
            self.logprobs.extend(delta.logprobs[:keep])
        if delta.text:
            self.text_parts.append(delta.text)
        # Tokens past a stop string in one delta are forced by a grammar: logprob 0.
        self.cumulative_logprob = delta.cumulative_logprob
        if stop is not None:
            self.finish_reason, self.stop_reason = "stop", stop
        elif delta.finish_reason is not None:
            self.finish_reason, self.stop_reason = delta.finish_reason, delta.stop_reason

    def _detokenize(self, delta: CompletionOutput) -> tuple[int, str | None]:
        """Feeds the delta's ids to the detokenizer, one by one as the engine does; the
        number of ids to keep and the stop string that ended the choice, if any."""
        ids = delta.token_ids
        if self.detokenizer is None:
            return len(ids), None
        for k, token_id in enumerate(ids):
            # The core ends a choice with "stop" only on a stop token id (EOS included):
            # its text is left out unless include_stop_str_in_output.
            stop_terminated = k == len(ids) - 1 and delta.finish_reason == "stop"
            stop = self.detokenizer.update([token_id], stop_terminated)
            if stop is not None:
                return k + 1, stop
        return len(ids), None

    def snapshot(self) -> CompletionOutput:
        if self.detokenizer is not None:
            text = self.detokenizer.get_output_text(self.finish_reason is not None)
        else:
            if len(self.text_parts) > 1:
                self.text_parts = ["".join(self.text_parts)]
            text = self.text_parts[0] if self.text_parts else ""
        return CompletionOutput(
            self.index, text, list(self.token_ids), self.cumulative_logprob,
            list(self.logprobs) if self.logprobs is not None else None,
            self.finish_reason, self.stop_reason)


__all__ = ["OutputMerger", "OutputPacker", "core_params", "wants_merging"]
