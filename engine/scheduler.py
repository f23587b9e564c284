"""Continuous batching over one token budget: no prefill or decode phase.

Every step each request brings ``num_computed_tokens`` towards ``num_tokens``; a
prompt is a request with many uncomputed tokens (chunked when the budget runs out), a
decode is a request with one. One step::

    budget = max_num_batched_tokens
    1. running requests, in priority order: take min(uncomputed, budget) tokens; when the
       KV pool cannot hold them, preempt (free + recompute later) the lowest-priority,
       latest running request, possibly this one
    2. if nobody was preempted: waiting requests in priority order, skipping those whose
       grammar is still compiling (WAITING_FOR_GRAMMAR) and ``n > 1`` siblings whose
       first sibling is still computing the shared prompt (they then hit its blocks in
       the prefix cache); stop at the first that does not fit (FCFS stays fair)

Order is FCFS by arrival, or ``(priority, arrival)`` with ``scheduling_policy="priority"``
(smaller priority value first, as in vLLM). The scheduler never imports model code.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from tamis.engine.kv_cache import KVCacheManager
from tamis.engine.request import Request, RequestStatus


@dataclass
class ScheduledRequest:
    """One request's share of a step: tokens ``start .. start + num_new_tokens - 1``.
    ``samples`` and ``num_prompt_logprob_rows`` are fixed when scheduled, so they stay
    true to this step after the engine appends the sampled token. ``samples`` defaults
    to reaching the request's last known token; the scheduler passes it explicitly
    (it also counts a token in flight, whose id the runner takes from the device)."""
    request: Request
    num_new_tokens: int
    start: int
    samples: bool | None = None
    num_prompt_logprob_rows: int = field(init=False)

    def __post_init__(self) -> None:
        request, end = self.request, self.start + self.num_new_tokens
        if self.samples is None:   # reaching the last known token: its logits pick the next one
            self.samples = end == request.num_tokens
        # Rows whose logits score the next *prompt* token (for prompt_logprobs).
        self.num_prompt_logprob_rows = (max(0, min(end, request.num_prompt_tokens - 1) - self.start)
                                        if request.wants_prompt_logprobs else 0)

    @property
    def token_ids(self) -> list[int]:
        """The ids of the scheduled tokens; 0 stands for a token in flight (its id is
        written on the device by the runner)."""
        ids = self.request.all_token_ids[self.start:self.start + self.num_new_tokens]
        return ids if len(ids) == self.num_new_tokens else ids + [0] * (self.num_new_tokens - len(ids))

    @property
    def block_ids(self) -> list[int]:
        return self.request.block_ids

    @property
    def group_block_ids(self) -> list[list[int]]:
        """The block tables of KV-cache groups 1.. (empty for a model of one group)."""
        return self.request.group_block_ids


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)

    @property
    def num_scheduled_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class Scheduler:
    def __init__(self, kv_cache: KVCacheManager, max_num_seqs: int, max_num_batched_tokens: int,
                 scheduling_policy: str = "fcfs") -> None:
        self.kv_cache = kv_cache
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.by_priority = scheduling_policy == "priority"
        self.waiting: list[Request] = []     # sorted by sort_key
        self.running: list[Request] = []     # sorted by sort_key
        self.num_preemptions = 0
        self._prompt_leaders: dict[str, Request] = {}   # parent id -> sibling 0 of an n > 1 group

    # --- queues --------------------------------------------------------------------------

    def add_request(self, request: Request) -> None:
        if request.sampling_params.n > 1 and request.index == 0:
            self._prompt_leaders[request.parent_id] = request
        self._insert(self.waiting, request)

    def finish_request(self, request: Request, status: RequestStatus) -> None:
        """Ends a request (stopped, length, aborted, error) and frees its blocks."""
        assert RequestStatus.is_finished(status)
        for queue in (self.running, self.waiting):
            if request in queue:
                queue.remove(request)
        self.kv_cache.free(request)
        request.status = status
        if self._prompt_leaders.get(request.parent_id) is request:
            del self._prompt_leaders[request.parent_id]

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    def _insert(self, queue: list[Request], request: Request) -> None:
        keys = [r.sort_key(self.by_priority) for r in queue]
        queue.insert(bisect.bisect_right(keys, request.sort_key(self.by_priority)), request)

    # --- one step --------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        output = SchedulerOutput()
        budget = self._schedule_running(output, self.max_num_batched_tokens)
        if not output.preempted:
            self._schedule_waiting(output, budget)
        return output

    def _schedule_running(self, output: SchedulerOutput, budget: int) -> int:
        capacity_per_block = self.kv_cache.block_size
        scheduled = output.scheduled
        i = 0
        while i < len(self.running) and budget > 0:
            request = self.running[i]
            num_tokens = len(request.all_token_ids) + request.num_inflight_tokens
            start = request.num_computed_tokens
            num_new = min(num_tokens - start, budget)
            if num_new <= 0:
                i += 1
                continue
            # Most decode steps fit in the blocks held: no allocation to try.
            if (start + num_new > len(request.block_ids) * capacity_per_block
                    and not self._allocate_or_preempt(request, num_new, output)):
                break   # the request itself was preempted: it was the last one running
            scheduled.append(ScheduledRequest(request, num_new, start, start + num_new == num_tokens))
            budget -= num_new
            i += 1
        return budget

    def _allocate_or_preempt(self, request: Request, num_new: int, output: SchedulerOutput) -> bool:
        while self.kv_cache.allocate(request, num_new) is None:
            victim = self.running.pop()   # lowest priority, latest arrival
            self._preempt(victim)
            output.preempted.append(victim)
            if victim is request:
                return False
        return True

    def _preempt(self, request: Request) -> None:
        """Recompute preemption: drop the KV, keep the tokens, wait again."""
        self.kv_cache.free(request)
        request.num_computed_tokens = 0
        request.status = RequestStatus.PREEMPTED
        request.num_preemptions += 1
        request.metrics.num_preemptions += 1
        self.num_preemptions += 1
        self._insert(self.waiting, request)

    def _schedule_waiting(self, output: SchedulerOutput, budget: int) -> None:
        for request in list(self.waiting):
            if len(self.running) >= self.max_num_seqs or budget <= 0:
                return
            if request.status == RequestStatus.WAITING_FOR_GRAMMAR or self._waits_for_sibling(request):
                continue
            assert not request.num_inflight_tokens, "a waiting request has no token in flight"
            hits, num_hit = self.kv_cache.get_computed_blocks(request)
            num_new = min(request.num_tokens - num_hit, budget)
            if self.kv_cache.allocate(request, num_new, hits) is None:
                return
            self.kv_cache.prefix_cache_queries += request.num_tokens
            self.kv_cache.prefix_cache_hits += num_hit
            if request.num_preemptions == 0:
                request.num_cached_tokens = num_hit
                request.metrics.num_cached_tokens = num_hit
            request.num_computed_tokens = num_hit
            request.status = RequestStatus.RUNNING
            self.waiting.remove(request)
            self._insert(self.running, request)
            output.scheduled.append(ScheduledRequest(request, num_new, num_hit))
            budget -= num_new

    def _waits_for_sibling(self, request: Request) -> bool:
        """n > 1 siblings wait until sibling 0 has computed the shared prompt, so they
        reuse its blocks through the prefix cache instead of computing them again."""
        if request.index == 0 or not self.kv_cache.enable_prefix_caching:
            return False
        leader = self._prompt_leaders.get(request.parent_id)
        return leader is not None and leader.num_computed_tokens < leader.num_prompt_tokens

    def update_after_step(self, output: SchedulerOutput) -> None:
        """Marks the scheduled tokens computed, makes newly full blocks hittable and
        releases blocks that fell behind a sliding window."""
        kv = self.kv_cache
        caching, block_size = kv.enable_prefix_caching, kv.block_size
        drops = bool(kv.sliding_groups)
        for item in output.scheduled:
            request = item.request
            if request.status != RequestStatus.RUNNING:
                continue
            end = request.num_computed_tokens = item.start + item.num_new_tokens
            # kv.num_cacheable_blocks(request), inlined: this runs per request per step.
            if caching and (min(end, len(request.all_token_ids)) // block_size
                            > request.num_registered_blocks):
                kv.cache_computed_blocks(request)
            if drops:
                kv.drop_blocks_outside_window(request)


__all__ = ["Scheduler", "SchedulerOutput", "ScheduledRequest"]
