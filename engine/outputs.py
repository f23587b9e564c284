"""What the engine hands back, with vLLM's names.

Values are cumulative (everything generated so far) unless the request asked for
``RequestOutputKind.DELTA``. ``logprobs[i]`` belongs to ``token_ids[i]`` and maps token
ids (the sampled one plus the top-k) to ``Logprob``; ``prompt_logprobs[0]`` is ``None``
because the first prompt token has no context.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None           # 1 = most likely token
    decoded_token: str | None = None


SampleLogprobs = list[dict[int, Logprob]]
PromptLogprobs = list[dict[int, Logprob] | None]


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: SampleLogprobs | None
    finish_reason: str | None = None         # "stop" | "length" | "abort" | "error" | None
    stop_reason: int | str | None = None     # the stop string or stop token id that ended it

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestMetrics:
    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None
    num_cached_tokens: int = 0        # prompt tokens served from the prefix cache
    num_preemptions: int = 0
    max_tokens: int | None = None     # the request's max_tokens parameter


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    prompt_logprobs: PromptLogprobs | None
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics | None = None
    error: str | None = None
    num_cached_tokens: int = 0
    error_code: str | None = None   # set with ``error`` for server-side limits ("compile_time_limit")


__all__ = ["Logprob", "CompletionOutput", "RequestOutput", "RequestMetrics",
           "SampleLogprobs", "PromptLogprobs"]
