"""A request owns all of its progress; the scheduler, KV manager and engine update it.

Token layout of one request (prompt then outputs, one growing list)::

    all_token_ids:  [p0 p1 p2 p3 p4 p5 | o0 o1 o2]
                     <---- prompt ---->  <output>
    num_computed_tokens = 8  -> KV exists for p0..o1; o2 was sampled last step and is
                                the one token the next decode step computes.

While a step runs on the device its sampled token is "in flight" (``num_inflight_tokens``
= 1): the scheduler counts it, so the next step can be scheduled before its id reaches
the host.

Status moves WAITING (or WAITING_FOR_GRAMMAR until its grammar compiles) -> RUNNING
-> FINISHED_*; preemption moves RUNNING -> PREEMPTED (waiting again, KV dropped,
``num_computed_tokens`` back to 0: the prompt and outputs so far are recomputed).
"""
from __future__ import annotations

import enum
import itertools
import sys
import time
from typing import Any

import torch

from tamis.engine.outputs import Logprob, RequestMetrics
from tamis.engine.sampling_params import SamplingParams


class RequestStatus(enum.IntEnum):
    WAITING = enum.auto()
    WAITING_FOR_GRAMMAR = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    # Everything after PREEMPTED is finished.
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH = enum.auto()
    FINISHED_ABORTED = enum.auto()
    FINISHED_ERROR = enum.auto()

    @staticmethod
    def is_finished(status: "RequestStatus") -> bool:
        return status > RequestStatus.PREEMPTED

    @staticmethod
    def finish_reason(status: "RequestStatus") -> str | None:
        return _FINISH_REASONS.get(status)


_ARRIVAL_ORDER = itertools.count()   # ties in wall-clock time must not reorder requests

_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
    RequestStatus.FINISHED_ERROR: "error",
}


class Request:
    """One sequence being generated. For ``n > 1`` the engine makes ``n`` of these
    (``index`` 0..n-1) under one ``parent_id``; they share prompt blocks through the
    prefix cache."""

    def __init__(self, request_id: str, prompt_token_ids: list[int], sampling_params: SamplingParams,
                 prompt: str | None = None, priority: int = 0, arrival_time: float | None = None,
                 parent_id: str | None = None, index: int = 0) -> None:
        self.request_id = request_id
        self.parent_id = parent_id if parent_id is not None else request_id
        self.index = index
        self.prompt = prompt
        self.prompt_token_ids = list(prompt_token_ids)
        self.sampling_params = sampling_params
        self.priority = priority
        self.arrival_time = time.time() if arrival_time is None else arrival_time
        self.arrival_order = next(_ARRIVAL_ORDER)
        self.status = RequestStatus.WAITING
        self.output_token_ids: list[int] = []
        self.all_token_ids: list[int] = list(self.prompt_token_ids)
        self.num_prompt_tokens = len(self.prompt_token_ids)   # the prompt never changes
        self.num_computed_tokens = 0
        # A token sampled by a step still running on the device (its id not yet on the
        # host): 0 or 1. The scheduler may schedule it already; the runner then takes its
        # id from the device (engine/engine.py, "Pipelining").
        self.num_inflight_tokens = 0
        self.block_ids: list[int] = []        # block table of KV-cache group 0
        self.group_block_ids: list[list[int]] = []   # groups 1.. (hybrid models: kv_groups.py)
        self.num_registered_blocks = 0        # leading full blocks registered in the prefix cache
        self.num_dropped_blocks = [0]         # per group: leading blocks released behind its window
        self.block_hashes: list[int] = []     # prefix-cache hash chain of full blocks
        self.num_cached_tokens = 0            # prompt tokens served by the prefix cache
        self.cache_salt: str | None = None    # prefix-cache hits only among equal salts
        self.num_preemptions = 0
        self.stop_reason: int | str | None = None
        self.error: str | None = None
        self.error_code: str | None = None   # e.g. "compile_time_limit": a server-side limit
        # The constrain subpackage's per-request state (matcher, compile future); opaque here.
        self.grammar_state: Any = None
        self.generator: torch.Generator | None = None
        # Results accumulated by the engine.
        self.output_logprobs: list[dict[int, Logprob]] | None = (
            [] if sampling_params.logprobs is not None else None)
        self.cumulative_logprob: float | None = (
            0.0 if sampling_params.logprobs is not None else None)
        self.prompt_logprobs: list[dict[int, Logprob] | None] | None = (
            [None] if sampling_params.prompt_logprobs is not None else None)
        self.detokenizer: Any = None
        # Set by the engine from the parameters (engine/inflight.py, LLMEngine._append_plain).
        self.pipelinable = False      # may sample with its last token in flight
        self.max_total_tokens = sys.maxsize   # prompt + max_tokens, capped by max_model_len
        self.simple_append = False    # no grammar, logprobs or text to update per token
        self.metrics = RequestMetrics(arrival_time=self.arrival_time,
                                      max_tokens=sampling_params.max_tokens)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def is_finished(self) -> bool:
        return RequestStatus.is_finished(self.status)

    @property
    def finish_reason(self) -> str | None:
        return RequestStatus.finish_reason(self.status)

    @property
    def wants_prompt_logprobs(self) -> bool:
        """True while prompt logprobs are still to be computed (never again after preemption)."""
        return (self.prompt_logprobs is not None
                and len(self.prompt_logprobs) < self.num_prompt_tokens)

    def append_output_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)

    def sort_key(self, by_priority: bool) -> tuple:
        """Scheduling order: smaller first. FCFS = arrival; priority = (priority, arrival)."""
        if by_priority:
            return (self.priority, self.arrival_order)
        return (self.arrival_order,)

    def __repr__(self) -> str:
        return (f"Request({self.request_id!r}, {self.status.name}, prompt={self.num_prompt_tokens}, "
                f"output={self.num_output_tokens}, computed={self.num_computed_tokens})")


__all__ = ["Request", "RequestStatus"]
