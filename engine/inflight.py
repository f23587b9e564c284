"""Pipelined steps (vLLM's async scheduling): queue step N+1 before reading step N's ids.

A step's device work (forward, logits, sampling) is queued without waiting; only
reading the sampled ids waits. With pipelining the engine schedules and queues the
next step first, so the device never idles while the host appends tokens::

    host:    sched N+1 | prep N+1 | queue N+1 | wait ids N | append N, stops, outputs | sched N+2 ...
    device:  ...... forward+sample N ......| ...... forward+sample N+1 ......| ...

Each sampling request of step N has one token *in flight* (``num_inflight_tokens``):
the scheduler schedules it for step N+1 at position ``num_tokens``, and the runner
writes its id into N+1's input from N's ids on the device (``InflightTokens``).
Consequences, all handled where the ids arrive (``LLMEngine._finish_step``):

- a request that stops at N (EOS, stop string, abort) already has a row in N+1: that
  token is dropped (its KV write lands in blocks the request frees; a later owner of
  those blocks writes them in a later step, after N+1 on the device);
- a request preempted while its token is in flight gets the token appended (it was
  sampled from valid state) and recomputes it with the rest.

Structured outputs are pipelined too: a step with constrained rows queues its forward
pass, then reads the previous step's ids and advances the matchers, then fills the
bitmasks and queues its sampling, so the grammar work runs while the device computes
the forward pass. ``min_tokens`` counts the tokens in flight with those appended
(``LaunchedStep.num_sampled_before``). Not pipelined (``pipelinable`` is False): penalties
(output token counts read on the host while sampling), prompt logprobs, and constrained
requests when jump-forward is on (it appends tokens the next step did not schedule). A
step holding any such request is finished before the next is scheduled, so they never
have a token in flight. A request known to finish by length at N gets none (nothing to
schedule for it at N+1).
"""
from __future__ import annotations

from dataclasses import dataclass

from tamis.engine.request import Request
from tamis.engine.runner import InflightTokens, RunnerOutput
from tamis.engine.sampler import SampledTokens
from tamis.engine.sampling_params import SamplingParams
from tamis.engine.scheduler import SchedulerOutput


def is_pipelinable(params: SamplingParams, jump_forward: bool = False) -> bool:
    """Whether a request with ``params`` samples correctly with its last token in flight
    (``jump_forward``: the engine appends forced tokens of constrained requests)."""
    return ((params.structured_outputs is None or not jump_forward)
            and params.prompt_logprobs is None and params.repetition_penalty == 1.0
            and params.presence_penalty == 0.0 and params.frequency_penalty == 0.0
            and not params.bad_words_token_ids)


@dataclass
class LaunchedStep:
    """A step queued on the device. ``requests`` are its sampling rows in order."""
    batch: SchedulerOutput
    result: RunnerOutput
    requests: list[Request]
    sampled: SampledTokens | None
    pipelined: bool = False      # its ids are read after the next step is queued
    marked: list[Request] | None = None   # requests given a token in flight by this step

    def mark_inflight(self) -> None:
        """Counts each sampling request's new token in flight, except for requests that
        finish by length with it (``max_total_tokens``: nothing more to compute). A request can hold two
        for a moment: this step's and the previous step's, not read yet."""
        self.marked = []
        for request in self.requests:
            # Its token count once this step's and any earlier in-flight token are appended.
            num_after = len(request.all_token_ids) + request.num_inflight_tokens + 1
            if num_after < request.max_total_tokens:
                request.num_inflight_tokens += 1
                self.marked.append(request)

    def num_sampled_before(self) -> list[int]:
        """Per sampling row, the tokens its request sampled before this step's sampling:
        those appended and those in flight, less this step's own when it is already
        marked (a constrained step samples after ``mark_inflight``)."""
        own = {id(r) for r in self.marked or ()}
        return [r.num_output_tokens + r.num_inflight_tokens - (id(r) in own)
                for r in self.requests]

    def unmark_inflight(self) -> None:
        """The ids arrived: the tokens are no longer in flight."""
        for request in self.marked or ():
            request.num_inflight_tokens -= 1

    def inflight_tokens(self, batch: SchedulerOutput) -> InflightTokens | None:
        """Where ``batch`` (the next step) takes this step's ids: every scheduled request
        with a token in flight has it as its last scheduled token."""
        row_of = None
        rows, source_rows = [], []
        last_row = -1
        for item in batch.scheduled:
            last_row += item.num_new_tokens
            request = item.request
            if request.num_inflight_tokens:
                if row_of is None:
                    row_of = {id(r): i for i, r in enumerate(self.requests)}
                rows.append(last_row)
                source_rows.append(row_of[id(request)])
        if not rows:
            return None
        return InflightTokens(rows, source_rows, self.sampled.token_ids)


__all__ = ["LaunchedStep", "is_pipelinable"]
