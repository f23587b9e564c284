"""Prometheus metrics with vLLM's V1 names, labels and buckets, under a namespace prefix.

``namespace`` is ``tamis`` by default (``tamis:num_requests_running``); ``vllm`` (``tamis
serve --metrics-namespace vllm``) serves exactly vLLM's names, so its Grafana dashboards
work unchanged. Every series carries vLLM's labels ``model_name`` (the first served name)
and ``engine`` ("0"). docs/metrics.md lists each metric with its type, labels and buckets.

Two kinds:
- per-request counters and histograms, observed by the server when a request finishes
  (``observe_finished``, this module);
- engine state read at scrape time from the step loop's latest ``EngineStats``
  (``metrics_engine.EngineCollector``).

Each app owns its own ``CollectorRegistry`` so several servers in one process (tests)
never share series.
"""
from __future__ import annotations

import re

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics

from tamis.server.metrics_engine import ENGINE_INDEX, LABELS, EngineCollector

disable_created_metrics()  # no `*_created` series, as vLLM

# vLLM 0.26's buckets (vllm/v1/metrics/loggers.py).
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
TOKEN_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
                         2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
                           40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
N_BUCKETS = (1, 2, 5, 10, 20)
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")  # vLLM's, all pre-created

_NAMESPACE = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


def one_two_five_buckets(limit: int) -> tuple[int, ...]:
    """1, 2, 5, 10, 20, 50, ... up to ``limit`` inclusive (vLLM's token-count buckets)."""
    buckets, scale = [], 1
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * scale > limit:
                return tuple(buckets)
            buckets.append(mantissa * scale)
        scale *= 10


def _histograms(max_model_len: int) -> list[tuple[str, str, str, tuple]]:
    """(attribute, name, help, buckets) of each per-request histogram."""
    tokens = one_two_five_buckets(max_model_len)
    return [
        ("ttft", "time_to_first_token_seconds", "Histogram of time to first token in seconds.",
         TTFT_BUCKETS),
        ("itl", "inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
         TOKEN_LATENCY_BUCKETS),
        ("tpot", "request_time_per_output_token_seconds",
         "Histogram of time_per_output_token_seconds per request.", TOKEN_LATENCY_BUCKETS),
        ("e2e", "e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
         REQUEST_LATENCY_BUCKETS),
        ("queue_time", "request_queue_time_seconds",
         "Histogram of time spent in WAITING phase for request.", REQUEST_LATENCY_BUCKETS),
        ("inference_time", "request_inference_time_seconds",
         "Histogram of time spent in RUNNING phase for request.", REQUEST_LATENCY_BUCKETS),
        ("prefill_time", "request_prefill_time_seconds",
         "Histogram of time spent in PREFILL phase for request.", REQUEST_LATENCY_BUCKETS),
        ("decode_time", "request_decode_time_seconds",
         "Histogram of time spent in DECODE phase for request.", REQUEST_LATENCY_BUCKETS),
        ("request_prompt_tokens", "request_prompt_tokens", "Number of prefill tokens processed.",
         tokens),
        ("request_generation_tokens", "request_generation_tokens",
         "Number of generation tokens processed.", tokens),
        ("max_generation_tokens", "request_max_num_generation_tokens",
         "Histogram of maximum number of requested generation tokens.", tokens),
        ("params_n", "request_params_n", "Histogram of the n request parameter.", N_BUCKETS),
        ("params_max_tokens", "request_params_max_tokens",
         "Histogram of the max_tokens request parameter.", tokens),
        ("prefill_kv_computed", "request_prefill_kv_computed_tokens",
         "Histogram of new KV tokens computed during prefill (excluding cached tokens).", tokens),
    ]


class ServerMetrics:
    """The server's registry: engine state (scrape time) and per-request observations.

    ``namespace`` prefixes every name (``tamis`` or ``vllm``); ``max_model_len`` bounds the
    token-count buckets as in vLLM. ValueError for a namespace Prometheus cannot name.
    """

    def __init__(self, async_engine, model_name: str, max_model_len: int = 2048,
                 namespace: str = "tamis"):
        if not _NAMESPACE.fullmatch(namespace or ""):
            raise ValueError(f"metrics namespace must match [a-zA-Z_][a-zA-Z0-9_]*, "
                             f"got {namespace!r}")
        self.model_name = model_name
        self.namespace = namespace
        self.labels = [model_name, ENGINE_INDEX]
        self.registry = CollectorRegistry()
        self.registry.register(EngineCollector(async_engine, model_name, namespace))
        self.prompt_tokens = self._counter("prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = self._counter("generation_tokens",
                                               "Number of generation tokens processed.")
        self.request_success = self._counter("request_success",
                                             "Count of successfully processed requests.",
                                             "finished_reason")
        for reason in FINISH_REASONS:
            self.request_success.labels(*self.labels, reason)
        self.request_errors = self._counter("request_errors", "Requests answered with an error.",
                                            "status")
        self.structured_requests = self._counter("structured_output_requests",
                                                 "Requests carrying an output constraint.", "kind")
        for attr, name, doc, buckets in _histograms(max_model_len):
            histogram = Histogram(f"{namespace}:{name}", doc, LABELS, buckets=buckets,
                                  registry=self.registry)
            setattr(self, attr, histogram.labels(*self.labels))

    def _counter(self, name: str, doc: str, extra_label: str | None = None):
        labels = LABELS + ([extra_label] if extra_label else [])
        counter = Counter(f"{self.namespace}:{name}", doc, labels, registry=self.registry)
        return counter if extra_label else counter.labels(*self.labels)

    def observe_finished(self, output, times) -> None:
        """One finished ``RequestOutput`` with its ``RequestTimes`` (AsyncEngine callback).

        Per sequence (each of ``n``): finish reason, prompt and generated tokens, max_tokens.
        Per request: ``n``, the longest sequence, and the latencies (the server's clock for
        TTFT, inter-token and end-to-end; the engine's for queue, prefill, decode, inference
        and time per output token, which follow the first sequence).
        """
        prompt_len = len(output.prompt_token_ids or [])
        generated = [len(choice.token_ids) for choice in output.outputs]
        metrics = getattr(output, "metrics", None)
        self.prompt_tokens.inc(prompt_len)
        self.generation_tokens.inc(sum(generated))
        cached = max(getattr(output, "num_cached_tokens", 0) or 0, 0)
        for choice, num_generated in zip(output.outputs, generated):
            self.request_success.labels(*self.labels, choice.finish_reason or "abort").inc()
            self.request_prompt_tokens.observe(prompt_len)
            self.request_generation_tokens.observe(num_generated)
            self.prefill_kv_computed.observe(max(prompt_len - cached, 0))
            if getattr(metrics, "max_tokens", None):
                self.params_max_tokens.observe(metrics.max_tokens)
        self.params_n.observe(len(generated))
        self.max_generation_tokens.observe(max(generated, default=0))
        self._observe_server_times(times)
        if metrics is not None:
            self._observe_engine_times(metrics, generated[0] if generated else 0)

    def _observe_server_times(self, times) -> None:
        if times.first_output is not None:
            self.ttft.observe(times.first_output - times.arrival)
        for gap in times.inter_token_latencies:
            self.itl.observe(gap)
        if times.finished is not None:
            self.e2e.observe(times.finished - times.arrival)

    def _observe_engine_times(self, metrics, num_generated: int) -> None:
        """vLLM's phases: queued -> first scheduled -> first token -> last token."""
        scheduled = metrics.first_scheduled_time
        if scheduled is None:
            return
        self.queue_time.observe(max(0.0, scheduled - metrics.arrival_time))
        first, last = metrics.first_token_time, metrics.last_token_time
        if first is None or last is None:
            return
        self.prefill_time.observe(first - scheduled)
        self.decode_time.observe(last - first)
        self.inference_time.observe(last - scheduled)
        # The first token comes from the prefill; vLLM divides by the tokens after it.
        self.tpot.observe((last - first) / (num_generated - 1) if num_generated > 1 else 0.0)

    def observe_abort(self, _request_id: str) -> None:
        self.request_success.labels(*self.labels, "abort").inc()

    def observe_error(self, status: int) -> None:
        self.request_errors.labels(*self.labels, str(status)).inc()

    def observe_constraint(self, params) -> None:
        if params is None:
            return
        for kind in ("choice", "regex", "json", "grammar", "json_object", "structural_tag"):
            if getattr(params, kind, None) not in (None, False):
                self.structured_requests.labels(*self.labels, kind).inc()
                return
