"""From sequences to ``RequestOutput``s: groups the ``n`` sequences of one request, tracks
which requests have something new to report, and builds the outputs.

Cumulative mode (the default) reports everything so far; DELTA reports only what is
new since the last output; FINAL_ONLY reports once, when every sequence finished.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from tamis.engine.outputs import CompletionOutput, RequestOutput
from tamis.engine.request import Request
from tamis.engine.sampling_params import RequestOutputKind


@dataclass
class RequestGroup:
    """The n sequences of one user request and what was already reported (DELTA mode)."""
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    children: list[Request]
    output_kind: RequestOutputKind
    sent_tokens: list[int] = field(default_factory=list)
    sent_chars: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.sent_tokens = [0] * len(self.children)
        self.sent_chars = [0] * len(self.children)

    @property
    def finished(self) -> bool:
        return all(child.is_finished for child in self.children)


class OutputProcessor:
    def __init__(self) -> None:
        self.groups: dict[str, RequestGroup] = {}
        self._dirty: set[str] = set()     # groups with something new to report

    def __contains__(self, request_id: str) -> bool:
        return request_id in self.groups

    def __len__(self) -> int:
        return len(self.groups)

    def add(self, group: RequestGroup) -> None:
        self.groups[group.request_id] = group

    def pop(self, request_id: str) -> RequestGroup | None:
        """Forgets a group (abort): it is never reported again."""
        self._dirty.discard(request_id)
        return self.groups.pop(request_id, None)

    def mark(self, request_id: str) -> None:
        self._dirty.add(request_id)

    @property
    def has_news(self) -> bool:
        return bool(self._dirty)

    def collect(self) -> list[RequestOutput]:
        """Outputs of every marked group, in arrival order; finished groups are dropped."""
        outputs = []
        order = lambda rid: self.groups[rid].children[0].arrival_order  # noqa: E731
        for request_id in sorted(self._dirty, key=order):
            group = self.groups[request_id]
            if group.output_kind != RequestOutputKind.FINAL_ONLY or group.finished:
                outputs.append(make_request_output(group))
            if group.finished:
                del self.groups[request_id]
        self._dirty.clear()
        return outputs


def make_request_output(group: RequestGroup) -> RequestOutput:
    delta = group.output_kind == RequestOutputKind.DELTA
    completions = []
    for i, child in enumerate(group.children):
        text = child.detokenizer.get_output_text(child.is_finished) if child.detokenizer else ""
        tokens, logprobs = list(child.output_token_ids), child.output_logprobs
        if delta:
            text, tokens = text[group.sent_chars[i]:], tokens[group.sent_tokens[i]:]
            logprobs = logprobs[group.sent_tokens[i]:] if logprobs is not None else None
            group.sent_chars[i] += len(text)
            group.sent_tokens[i] += len(tokens)
        elif logprobs is not None:
            logprobs = list(logprobs)
        completions.append(CompletionOutput(child.index, text, tokens, child.cumulative_logprob,
                                            logprobs, child.finish_reason, child.stop_reason))
    leader = group.children[0]
    failed = [c for c in group.children if c.error]
    return RequestOutput(
        request_id=group.request_id, prompt=group.prompt, prompt_token_ids=group.prompt_token_ids,
        prompt_logprobs=list(leader.prompt_logprobs) if leader.prompt_logprobs is not None else None,
        outputs=completions, finished=group.finished, metrics=leader.metrics,
        error=failed[0].error if failed else None, num_cached_tokens=leader.num_cached_tokens,
        error_code=failed[0].error_code if failed else None)


__all__ = ["OutputProcessor", "RequestGroup", "make_request_output"]
