"""LLMEngine: the step loop shared by the offline ``LLM`` and the server's ``AsyncEngine``.

One step::

    grammars  -> WAITING_FOR_GRAMMAR requests whose grammar compiled become WAITING
                 (a failed compile finishes that request alone with finish_reason "error")
    schedule  -> SchedulerOutput (which tokens of which requests, preemptions)
    run       -> logits of the rows that sample (+ prompt-logprob rows)
    sample    -> one token per sampling row (constraint bitmask from structured outputs),
                 queued on the device; nothing has waited for the device so far
    update    -> wait for the ids; append tokens, stop checks, incremental detokenization
    outputs   -> RequestOutput per request that advanced or finished

With pipelining (``async_scheduling``, on by default on CUDA) "update" handles the
*previous* step's ids, after this step was queued, so the device works while the host
appends and schedules (``engine/inflight.py``). Outputs are the same, one step later. A
step with constrained rows queues its forward pass first and samples after the previous
step's tokens are appended: the bitmasks need the matchers advanced over them.

A request with ``n > 1`` becomes n sequences (``Request``) under one id; they share the
prompt's KV blocks through the prefix cache and report together in one ``RequestOutput``.
Bad input raises ``ValueError`` from ``add_request`` and never disturbs other requests.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import time
from typing import Any

import torch

from tamis.engine.config import EngineConfig, resolve_max_model_len
from tamis.engine.detokenizer import IncrementalDetokenizer, check_token_stop
from tamis.engine.inflight import LaunchedStep, is_pipelinable
from tamis.engine.kv_cache import KVCacheManager
from tamis.engine.kv_groups import max_tokens_per_request
from tamis.engine.loader import tokenizer_path
from tamis.engine.output_processor import OutputProcessor, RequestGroup
from tamis.engine.outputs import Logprob, RequestOutput
from tamis.engine.request import Request, RequestStatus
from tamis.engine.runner import RunnerOutput, make_runner
from tamis.engine.sampler import SamplingMetadata, TopLogprobs, gather_logprobs
from tamis.engine.sampling_params import RequestOutputKind, SamplingParams
from tamis.engine.scheduler import Scheduler, SchedulerOutput
from tamis.engine.stats import ITERATION_TOKEN_BUCKETS, CumulativeHistogram, EngineStats
from tamis.engine.tokenizer import TokenDecoder, eos_token_ids, load_tokenizer

logger = logging.getLogger(__name__)


class LLMEngine:
    def __init__(self, config: EngineConfig | None = None, **engine_args: Any) -> None:
        self.config = config if config is not None else EngineConfig.from_kwargs(**engine_args)
        torch.manual_seed(self.config.seed)
        self.device = self.config.resolved_device()
        self.runner = make_runner(self.config, self.device)
        self.hf_config = self.runner.hf_config
        self.vocab_size = self.runner.vocab_size
        self.model_dir = self.runner.model_dir   # config.model resolved once, by the loader
        self.tokenizer = None
        if not self.config.skip_tokenizer_init:
            self.tokenizer = load_tokenizer(tokenizer_path(self.config, self.model_dir),
                                            self.config.trust_remote_code)
        self.eos_token_ids = eos_token_ids(self.tokenizer, self.hf_config, self.model_dir)
        self._token_decoder = TokenDecoder(self.tokenizer) if self.tokenizer is not None else None
        self._init_cache_and_scheduler()
        self.outputs = OutputProcessor()
        self._structured = None
        self._shut_down = False
        row_workers = self.config.resolved_structured_outputs_workers(self.device)
        if self.tokenizer is not None and row_workers > 0:
            # Made now so its row worker processes start while the engine warms up, not
            # when the first constrained request arrives.
            self._structured_manager()
        self._counters = {"prompt": 0, "generation": 0, "finished": 0}
        self._iteration_tokens = CumulativeHistogram(ITERATION_TOKEN_BUCKETS)
        self.async_scheduling = _async_scheduling_default(self.device)
        self._inflight: LaunchedStep | None = None        # a pipelined step not read yet
        self._last_sampling: SamplingMetadata | None = None

    def _init_cache_and_scheduler(self) -> None:
        config = self.config
        self.max_model_len = resolve_max_model_len(config.max_model_len, self.hf_config)
        budget = config.resolved_max_num_batched_tokens(self.device)
        num_blocks = self.runner.initialize_kv_cache(self.max_model_len, config.max_num_seqs, budget)
        windows = self.runner.kv_spec.group_windows
        capacity = max_tokens_per_request(windows, num_blocks, config.block_size, budget,
                                          self.max_model_len)
        if capacity < self.max_model_len:
            if config.max_model_len is not None:
                raise ValueError(f"--max-model-len {self.max_model_len} does not fit in the KV cache "
                                 f"({num_blocks} blocks x {config.block_size} tokens hold "
                                 f"{capacity} tokens of one request): lower --max-model-len "
                                 f"or raise the KV cache size")
            logger.warning("KV cache holds %d tokens: max_model_len lowered from %d", capacity,
                           self.max_model_len)
            self.max_model_len = capacity
        self.kv_cache = KVCacheManager(num_blocks, config.block_size, config.enable_prefix_caching,
                                       group_windows=windows)
        self.scheduler = Scheduler(self.kv_cache, config.max_num_seqs, budget, config.scheduling_policy)

    # --- requests ------------------------------------------------------------------------

    def add_request(self, request_id: str, prompt: str | list[int] | dict,
                    params: SamplingParams | None = None, priority: int = 0,
                    arrival_time: float | None = None) -> None:
        """Queues a request. Raises ValueError naming the problem (empty or too long
        prompt, token id outside the vocabulary, parameter the model cannot honour,
        duplicate id); nothing is queued then."""
        request_id = str(request_id)
        if self._shut_down:
            raise RuntimeError("the engine was shut down (shutdown()): make a new one")
        if request_id in self.outputs:
            raise ValueError(f"request id {request_id!r} is already in use")
        if priority != 0 and self.config.scheduling_policy != "priority":
            raise ValueError(f"priority={priority} needs scheduling_policy='priority' (this "
                             f"engine schedules {self.config.scheduling_policy!r}); send 0")
        params = params if params is not None else SamplingParams()
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params must be SamplingParams, got {type(params).__name__}")
        text, token_ids = self._tokenize(prompt, params)
        self._check_params(params)
        salt = _cache_salt(prompt)
        params = params.clone()
        if not params.ignore_eos:
            params.all_stop_token_ids |= self.eos_token_ids
        if params.bad_words:
            params.update_from_tokenizer(self.tokenizer, self.vocab_size)
        children = [self._make_child(request_id, text, token_ids, params, priority, arrival_time, i)
                    for i in range(params.n)]
        for child in children:
            child.cache_salt = salt
            if child.sampling_params.structured_outputs is not None:
                self._structured_manager().add_request(child)
                child.status = RequestStatus.WAITING_FOR_GRAMMAR
        self.outputs.add(RequestGroup(request_id, text, token_ids, children, params.output_kind))
        for child in children:
            self.scheduler.add_request(child)

    def _tokenize(self, prompt: Any, params: SamplingParams) -> tuple[str | None, list[int]]:
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                prompt = list(prompt["prompt_token_ids"])
            elif "prompt" in prompt:
                prompt = prompt["prompt"]
            else:
                raise ValueError("a dict prompt needs 'prompt' or 'prompt_token_ids'")
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("text prompts need a tokenizer (the engine runs with skip_tokenizer_init)")
            text, token_ids = prompt, self.tokenizer.encode(prompt)
        elif isinstance(prompt, (list, tuple)):
            text, token_ids = None, list(prompt)
            bad = [t for t in token_ids if isinstance(t, bool) or not isinstance(t, int)
                   or not 0 <= t < self.vocab_size]
            if bad:
                raise ValueError(f"prompt token id {bad[0]!r} is out of vocabulary "
                                 f"(valid ids: 0..{self.vocab_size - 1})")
        else:
            raise ValueError(f"prompt must be a string or a list of token ids, got {type(prompt).__name__}")
        if params.truncate_prompt_tokens is not None:
            token_ids = token_ids[-params.truncate_prompt_tokens:]
        if not token_ids:
            raise ValueError("the prompt is empty: give at least one token")
        if len(token_ids) > self.max_model_len:
            raise ValueError(f"the prompt ({len(token_ids)} tokens) is longer than the maximum "
                             f"model length of {self.max_model_len} tokens")
        return text, token_ids

    def _check_params(self, params: SamplingParams) -> None:
        limit = self.config.max_logprobs
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(params, name)
            if value is not None and limit != -1 and (value == -1 or value > limit):
                raise ValueError(f"{name}={value} exceeds the engine's max_logprobs={limit} "
                                 f"(raise --max-logprobs)")
        for name, ids in (("logit_bias", list(params.logit_bias or ())),
                          ("allowed_token_ids", params.allowed_token_ids or [])):
            bad = [t for t in ids if not 0 <= t < self.vocab_size]
            if bad:
                raise ValueError(f"{name} holds token id {bad[0]} outside the vocabulary "
                                 f"(valid ids: 0..{self.vocab_size - 1})")
        if self.tokenizer is None and (params.stop or params.bad_words
                                       or params.structured_outputs is not None):
            raise ValueError("stop strings, bad_words and structured_outputs need a tokenizer")
        spec = params.structured_outputs
        if spec is not None and hasattr(spec, "validate"):
            spec.validate()

    def _make_child(self, request_id: str, text: str | None, token_ids: list[int],
                    params: SamplingParams, priority: int, arrival_time: float | None,
                    index: int) -> Request:
        child_params = params
        if params.n > 1:
            child_params = params.clone()
            if params.seed is not None:
                child_params.seed = params.seed + index   # vLLM's parallel-sampling seeds
        child_id = request_id if params.n == 1 else f"{index}_{request_id}"
        child = Request(child_id, token_ids, child_params, prompt=text, priority=priority,
                        arrival_time=arrival_time, parent_id=request_id, index=index)
        if index > 0:
            child.prompt_logprobs = None   # computed once, by sequence 0
        if child_params.seed is not None:
            child.generator = torch.Generator(device=self.device).manual_seed(child_params.seed)
        if self.tokenizer is not None and child_params.detokenize:
            child.detokenizer = IncrementalDetokenizer(self.tokenizer, token_ids, child_params)
        if child_params.max_tokens is not None:
            child.max_total_tokens = len(token_ids) + child_params.max_tokens
        child.max_total_tokens = min(child.max_total_tokens, self.max_model_len)
        child.pipelinable = is_pipelinable(child_params, self.config.structured_outputs_jump_forward)
        child.simple_append = (child.detokenizer is None and child.output_logprobs is None
                               and child_params.structured_outputs is None)
        return child

    def abort_request(self, request_ids: str | list[str]) -> None:
        """Ends requests now and frees their blocks; no further output is reported."""
        for request_id in [request_ids] if isinstance(request_ids, str) else request_ids:
            group = self.outputs.pop(str(request_id))
            if group is None:
                continue
            for child in group.children:
                if not child.is_finished:
                    self.scheduler.finish_request(child, RequestStatus.FINISHED_ABORTED)
                    self._forget_grammar(child)

    def has_unfinished_requests(self) -> bool:
        return len(self.outputs) > 0

    def get_num_unfinished_requests(self) -> int:
        return len(self.outputs)

    # --- the step ----------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Schedules and queues one step; appends the tokens of the step before it when
        pipelining (``engine/inflight.py``), else of this one. Returns the outputs of
        the requests that advanced or finished."""
        self._promote_ready_grammars()
        batch = self.scheduler.schedule()
        previous, self._inflight = self._inflight, None
        if batch.is_empty:
            if previous is not None:
                self._finish_step(previous)
            elif len(self.outputs) and not self.outputs.has_news and not self._has_compiling_grammar():
                raise RuntimeError("scheduler made no progress with requests pending "
                                   f"(waiting={len(self.scheduler.waiting)}): KV cache too small?")
            return self.outputs.collect()
        self._record_schedule(batch)
        launched = self._launch(batch, previous)
        if previous is not None:
            self._finish_step(previous)
        if launched.requests and launched.sampled is None:
            # Constrained rows: their masks need the previous step's tokens, accepted just
            # now, while the device runs this step's forward pass.
            self._sample(launched)
        if launched.pipelined:
            self._inflight = launched
        else:
            self._finish_step(launched)
        return self.outputs.collect()

    def _record_schedule(self, batch: SchedulerOutput) -> None:
        now = time.time()
        num_prompt = 0
        for item in batch.scheduled:
            request = item.request
            if item.start < request.num_prompt_tokens:
                if request.metrics.first_scheduled_time is None:
                    request.metrics.first_scheduled_time = now
                num_prompt += min(item.start + item.num_new_tokens, request.num_prompt_tokens) - item.start
        self._counters["prompt"] += num_prompt
        self._iteration_tokens.observe(batch.num_scheduled_tokens)

    def _launch(self, batch: SchedulerOutput, previous: LaunchedStep | None) -> LaunchedStep:
        """Queues the forward pass of ``batch`` and, unless a sampling row is constrained,
        its sampling (``step`` samples constrained batches once the previous step's tokens
        are accepted); reads nothing back."""
        inflight = previous.inflight_tokens(batch) if previous is not None else None
        result = self.runner.execute_model(batch, inflight)
        self.scheduler.update_after_step(batch)
        requests = [item.request for item in batch.scheduled if item.samples]
        launched = LaunchedStep(batch, result, requests, None)
        if requests and not self._any_constrained(requests):
            self._sample(launched)
        # Counted when sampled (stats taken between pipelined steps see them); tokens
        # dropped later are taken back in _finish_step.
        self._counters["generation"] += len(requests)
        if (self.async_scheduling and requests and not result.prompt_logits
                and all(item.request.pipelinable for item in batch.scheduled)):
            launched.pipelined = True
            launched.mark_inflight()
        return launched

    def _sample(self, launched: LaunchedStep) -> None:
        """Queues the sampling of ``launched``'s rows, under their constraint masks."""
        requests = launched.requests
        meta = self._sampling_metadata(requests)
        if meta.any_min_tokens:
            meta = dataclasses.replace(meta, num_sampled=launched.num_sampled_before())
        bitmask, rows = self._fill_bitmask(requests)
        launched.sampled = self.runner.sample(launched.result.sample_logits, meta, bitmask, rows)

    def _any_constrained(self, requests: list[Request]) -> bool:
        return self._structured is not None and any(
            r.sampling_params.structured_outputs is not None for r in requests)

    def _sampling_metadata(self, requests: list[Request]) -> SamplingMetadata:
        """Built once per batch composition: decode steps often repeat the last one."""
        cached = self._last_sampling
        if cached is not None and cached.requests == requests:   # identity, element-wise
            return cached
        self._last_sampling = SamplingMetadata.build(requests, self.vocab_size, self.device)
        return self._last_sampling

    def _finish_step(self, launched: LaunchedStep) -> None:
        """Waits for the step's ids, then appends them (stop checks, detokenization)."""
        self._process_prompt_logprobs(launched.batch, launched.result)
        if launched.sampled is None:
            return
        out = launched.sampled.result()
        launched.unmark_inflight()
        entries = self._logprob_entries(out.logprobs) if out.logprobs is not None else None
        now = time.time()
        for row, (request, token_id) in enumerate(zip(launched.requests, out.token_ids)):
            if request.status > RequestStatus.PREEMPTED:
                # Finished while this step ran (stopped a step late, aborted): dropped.
                self._counters["generation"] -= 1
                continue
            if request.simple_append:
                self._append_plain(request, token_id, now)
            else:
                wants = request.output_logprobs is not None
                self._append_token(request, token_id, entries[row] if wants else None, now)

    def _append_plain(self, request: Request, token_id: int, now: float) -> None:
        """``_append_one`` for a request without grammar, logprobs or text (the common
        case of offline token-id workloads): the same effects, fewer calls."""
        request.output_token_ids.append(token_id)
        request.all_token_ids.append(token_id)
        metrics = request.metrics
        if metrics.first_token_time is None:
            metrics.first_token_time = now
        metrics.last_token_time = now
        params = request.sampling_params
        # Only a stop id or reaching the length limit can end it: the full rules then.
        if token_id in params.all_stop_token_ids or len(request.all_token_ids) >= request.max_total_tokens:
            status = check_token_stop(request, self.max_model_len)
            if status is not None:
                self._finish(request, status, now=now)
                return
        if params.output_kind != RequestOutputKind.FINAL_ONLY:
            self.outputs.mark(request.parent_id)

    def _append_token(self, request: Request, token_id: int,
                      logprob: tuple[dict[int, Logprob], float] | None, now: float) -> None:
        error = self._constraint_error(request)
        if error is not None:   # its matcher failed mid-decode: the EOS it was given is no answer
            self._finish(request, RequestStatus.FINISHED_ERROR, error, now=now)
            return
        forced = self._accept_structured(request, token_id)
        for i, token in enumerate([token_id] + forced):
            if i > 0:
                self._counters["generation"] += 1
                logprob = ({token: Logprob(0.0, 1, self._decode_token(token))}, 0.0) \
                    if request.output_logprobs is not None else None   # forced by the grammar
            if self._append_one(request, token, logprob, now):
                return

    def _append_one(self, request: Request, token_id: int,
                    logprob: tuple[dict[int, Logprob], float] | None, now: float) -> bool:
        """Appends one token and applies every stop rule; True when the request finished."""
        request.append_output_token(token_id)
        request.metrics.first_token_time = request.metrics.first_token_time or now
        request.metrics.last_token_time = now
        if logprob is not None:
            request.output_logprobs.append(logprob[0])
            request.cumulative_logprob += logprob[1]
        status = check_token_stop(request, self.max_model_len)
        if request.detokenizer is not None:
            stop_terminated = (status == RequestStatus.FINISHED_STOPPED
                               and token_id in request.sampling_params.all_stop_token_ids)
            stop_string = request.detokenizer.update([token_id], stop_terminated)
            if stop_string is not None:
                status, request.stop_reason = RequestStatus.FINISHED_STOPPED, stop_string
        if status is not None:
            self._finish(request, status, now=now)
            return True
        if request.sampling_params.output_kind != RequestOutputKind.FINAL_ONLY:
            self.outputs.mark(request.parent_id)
        return False

    def _finish(self, request: Request, status: RequestStatus, error: str | None = None,
                now: float | None = None) -> None:
        request.error = error
        request.metrics.finished_time = time.time() if now is None else now
        self.scheduler.finish_request(request, status)
        self._forget_grammar(request)
        self._counters["finished"] += 1
        self.outputs.mark(request.parent_id)

    # --- logprobs ------------------------------------------------------------------------------

    def _decode_token(self, token_id: int) -> str | None:
        return self._token_decoder(token_id) if self._token_decoder is not None else None

    def _logprob_entries(self, top: TopLogprobs) -> list[tuple[dict[int, Logprob], float]]:
        """Per row: {chosen token and top-k -> Logprob}, and the chosen token's logprob."""
        entries = []
        for ids, lps, rank in zip(top.token_ids.tolist(), top.logprobs.tolist(), top.ranks.tolist()):
            entry = {ids[0]: Logprob(lps[0], rank, self._decode_token(ids[0]))}
            for k, (token, lp) in enumerate(zip(ids[1:], lps[1:]), start=1):
                entry.setdefault(token, Logprob(lp, k, self._decode_token(token)))
            entries.append((entry, lps[0]))
        return entries

    def _process_prompt_logprobs(self, batch: SchedulerOutput, result: RunnerOutput) -> None:
        for index, logits in result.prompt_logits.items():
            item = batch.scheduled[index]
            request = item.request
            params = request.sampling_params
            k = self.vocab_size if params.prompt_logprobs == -1 else params.prompt_logprobs
            targets = request.all_token_ids[item.start + 1:item.start + 1 + logits.shape[0]]
            top = gather_logprobs(torch.log_softmax(logits, dim=-1),
                                  torch.tensor(targets, device=logits.device), min(k, self.vocab_size))
            for position, (entry, _) in enumerate(self._logprob_entries(top), start=item.start + 1):
                if position == len(request.prompt_logprobs):   # recomputed rows are skipped
                    request.prompt_logprobs.append(entry)

    # --- structured outputs (tamis.engine.structured_output, owned by constrain) ---------------

    def _structured_manager(self):
        if self._structured is None:
            try:
                from tamis.engine.structured_output import StructuredOutputManager
            except ImportError as exc:
                raise ValueError(f"structured outputs are unavailable: {exc}") from exc
            self._structured = StructuredOutputManager(
                self.tokenizer, self.vocab_size, self.config, eos_token_ids=self.eos_token_ids,
                num_workers=self.config.resolved_structured_outputs_workers(self.device),
                pin_memory=self.device.type == "cuda")
        return self._structured

    def _forget_grammar(self, request: Request) -> None:
        if self._structured is not None and request.sampling_params.structured_outputs is not None:
            remove = getattr(self._structured, "remove_request", None)
            if remove is not None:
                remove(request)

    def _has_compiling_grammar(self) -> bool:
        return any(r.status == RequestStatus.WAITING_FOR_GRAMMAR for r in self.scheduler.waiting)

    def _promote_ready_grammars(self) -> None:
        for request in list(self.scheduler.waiting):
            if request.status != RequestStatus.WAITING_FOR_GRAMMAR:
                continue
            try:
                ready = self._structured.is_ready(request)
            except Exception as exc:   # a failed compile fails this request alone
                request.error_code = getattr(exc, "code", None)
                self._finish(request, RequestStatus.FINISHED_ERROR, str(exc) or type(exc).__name__)
                continue
            if ready:
                request.status = RequestStatus.WAITING

    def _fill_bitmask(self, requests: list[Request]) -> tuple[torch.Tensor | None, list[int] | None]:
        if self._structured is None:   # no request ever asked for structured outputs
            return None, None
        rows = [i for i, r in enumerate(requests) if r.sampling_params.structured_outputs is not None]
        if not rows:
            return None, None
        bitmask = self._structured.fill_bitmask([requests[i] for i in rows])
        if bitmask is None:
            return None, None
        return bitmask, rows

    def _constraint_error(self, request: Request) -> str | None:
        """Why the request's constraint failed while decoding (the manager then allows EOS
        only), or None."""
        if self._structured is None or request.sampling_params.structured_outputs is None:
            return None
        return self._structured.error(request)

    def _accept_structured(self, request: Request, token_id: int) -> list[int]:
        """Advances the request's matcher; returns the tokens the grammar forces next
        (already accepted by the matcher: they go straight into the output)."""
        if request.sampling_params.structured_outputs is None:
            return []
        if token_id in request.sampling_params.all_stop_token_ids:
            return []
        if not self._structured.accept_token(request, token_id):
            logger.warning("request %s: token %d rejected by its grammar", request.request_id, token_id)
            return []
        if not self.config.structured_outputs_jump_forward:
            return []
        return list(self._structured.jump_forward_tokens(request) or [])

    # --- stats ------------------------------------------------------------------------------------

    def get_stats(self) -> EngineStats:
        kv = self.kv_cache
        return EngineStats(
            num_running=len(self.scheduler.running), num_waiting=len(self.scheduler.waiting),
            kv_cache_usage=kv.usage, num_free_blocks=kv.num_free_blocks, num_total_blocks=kv.num_blocks,
            prefix_cache_queries=kv.prefix_cache_queries, prefix_cache_hits=kv.prefix_cache_hits,
            num_preemptions=self.scheduler.num_preemptions,
            num_prompt_tokens=self._counters["prompt"], num_generation_tokens=self._counters["generation"],
            num_finished_requests=self._counters["finished"],
            num_waiting_for_grammar=sum(r.status == RequestStatus.WAITING_FOR_GRAMMAR
                                        for r in self.scheduler.waiting),
            iteration_tokens=self._iteration_tokens.copy(),
            **(self._structured.stats() if self._structured is not None else {}))

    def reset_prefix_cache(self) -> bool:
        return self.kv_cache.reset_prefix_cache()

    def shutdown(self) -> None:
        """Stops what the engine started beside this process: a tensor- or pipeline-
        parallel runner's other ranks and the structured-output row workers. Unfinished
        requests are aborted (their blocks freed); ``add_request`` refuses any after it.
        Idempotent."""
        self._shut_down = True
        self.abort_request(list(self.outputs.groups))
        if self._structured is not None:
            self._structured.close()
        stop_ranks = getattr(self.runner, "shutdown", None)
        if stop_ranks is not None:
            stop_ranks()


def _cache_salt(prompt: Any) -> str | None:
    """A dict prompt's ``cache_salt`` (vLLM's prompt key): a non-empty string, or None."""
    salt = prompt.get("cache_salt") if isinstance(prompt, dict) else None
    if salt is not None and (not isinstance(salt, str) or not salt):
        raise ValueError("cache_salt must be a non-empty string")
    return salt


def _async_scheduling_default(device: torch.device) -> bool:
    """Pipelined steps (engine/inflight.py): on by default on CUDA, where the device runs
    while the host works; ``TAMIS_ASYNC_SCHEDULING=0/1`` overrides (tests compare both)."""
    value = os.environ.get("TAMIS_ASYNC_SCHEDULING")
    if value is not None:
        return value.strip().lower() not in ("0", "false", "no", "off", "")
    return device.type == "cuda"


__all__ = ["LLMEngine"]
