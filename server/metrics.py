"""Prometheus metrics with vLLM's names under the ``tamis:`` prefix, labelled ``model_name``.

Two kinds:
- per-request counters and histograms, observed by the server when a request finishes
  (``observe_finished``): tokens, successes by finish reason, TTFT, inter-token latency
  (one observation per request: its mean gap between tokens, because the server reads
  coalesced cumulative outputs rather than every step), end-to-end latency, queue time;
- engine state read at scrape time from the step loop's latest ``EngineStats``
  (``EngineCollector``): running / waiting requests, KV usage and free/total blocks,
  prefix-cache queries and hits, preemptions, structured-output compile / mask figures.

Each app owns its own ``CollectorRegistry`` so several servers in one process (tests)
never share series.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

disable_created_metrics()  # no `*_created` series, as vLLM

_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
                    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0)
_TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000)

# (metric name, help, EngineStats attribute names tried in order)
_GAUGES = [
    ("tamis:num_requests_running", "Requests in the running batch.",
     ("num_running", "running", "num_requests_running")),
    ("tamis:num_requests_waiting", "Requests waiting to be scheduled.",
     ("num_waiting", "waiting", "num_requests_waiting")),
    ("tamis:kv_cache_usage_perc", "Share of KV cache blocks in use (0-1).",
     ("kv_cache_usage", "kv_usage", "kv_cache_usage_perc")),
    ("tamis:kv_cache_free_blocks", "Free KV cache blocks.",
     ("num_free_blocks", "free_blocks", "num_free_kv_blocks")),
    ("tamis:kv_cache_total_blocks", "Total KV cache blocks.",
     ("num_total_blocks", "total_blocks", "num_blocks", "num_kv_blocks")),
]
_COUNTERS = [
    ("tamis:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
     ("prefix_cache_queries",)),
    ("tamis:prefix_cache_hits", "Prompt tokens found in the prefix cache.",
     ("prefix_cache_hits",)),
    ("tamis:num_preemptions", "Requests preempted for KV space.",
     ("num_preemptions", "preemptions")),
    ("tamis:structured_output_compiles", "Grammars compiled.",
     ("structured_output_compiles", "grammar_compiles")),
    ("tamis:structured_output_cache_hits", "Grammar compilations served from the cache.",
     ("structured_output_cache_hits", "grammar_cache_hits")),
    ("tamis:structured_output_compile_seconds", "Total seconds spent compiling grammars.",
     ("structured_output_compile_seconds", "grammar_compile_seconds")),
    ("tamis:structured_output_mask_seconds", "Total seconds spent filling token bitmasks.",
     ("structured_output_mask_seconds", "bitmask_seconds")),
]


def _stat(stats, names):
    for name in names:
        value = getattr(stats, name, None)
        if value is not None:
            return float(value)
    return None


class EngineCollector:
    """Reads ``async_engine.last_stats`` at scrape time."""

    def __init__(self, async_engine, model_name: str):
        self.async_engine = async_engine
        self.model_name = model_name

    def collect(self):
        stats = self.async_engine.last_stats
        for name, doc, attrs in _GAUGES:
            family = GaugeMetricFamily(name, doc, labels=["model_name"])
            value = _stat(stats, attrs) if stats is not None else None
            if value is None and name.endswith("requests_running"):
                value = 0.0 if stats is None else None
            if value is not None:
                family.add_metric([self.model_name], value)
            yield family
        for name, doc, attrs in _COUNTERS:
            family = CounterMetricFamily(name, doc, labels=["model_name"])
            value = _stat(stats, attrs) if stats is not None else None
            if value is not None:
                family.add_metric([self.model_name], value)
            yield family
        in_flight = GaugeMetricFamily("tamis:num_requests_in_flight",
                                      "Requests the server is streaming or waiting on.",
                                      labels=["model_name"])
        in_flight.add_metric([self.model_name], self.async_engine.num_in_flight)
        yield in_flight


class ServerMetrics:
    def __init__(self, async_engine, model_name: str):
        self.model_name = model_name
        self.registry = CollectorRegistry()
        self.registry.register(EngineCollector(async_engine, model_name))
        labels = ["model_name"]
        reg = self.registry
        self.prompt_tokens = Counter("tamis:prompt_tokens", "Prefill tokens processed.",
                                     labels, registry=reg)
        self.generation_tokens = Counter("tamis:generation_tokens", "Tokens generated.",
                                         labels, registry=reg)
        self.request_success = Counter("tamis:request_success", "Finished requests.",
                                       labels + ["finished_reason"], registry=reg)
        self.request_errors = Counter("tamis:request_errors", "Requests answered with an error.",
                                      labels + ["status"], registry=reg)
        self.structured_requests = Counter("tamis:structured_output_requests",
                                           "Requests carrying an output constraint.",
                                           labels + ["kind"], registry=reg)
        self.ttft = Histogram("tamis:time_to_first_token_seconds", "Time to first token.",
                              labels, buckets=_LATENCY_BUCKETS, registry=reg)
        self.itl = Histogram("tamis:inter_token_latency_seconds", "Time between tokens.",
                             labels, buckets=_LATENCY_BUCKETS, registry=reg)
        self.e2e = Histogram("tamis:e2e_request_latency_seconds", "Request latency.",
                             labels, buckets=_LATENCY_BUCKETS, registry=reg)
        self.queue_time = Histogram("tamis:request_queue_time_seconds",
                                    "Time waiting before first scheduled.",
                                    labels, buckets=_LATENCY_BUCKETS, registry=reg)
        self.request_prompt_tokens = Histogram("tamis:request_prompt_tokens",
                                               "Prompt tokens per request.", labels,
                                               buckets=_TOKEN_BUCKETS, registry=reg)
        self.request_generation_tokens = Histogram("tamis:request_generation_tokens",
                                                   "Generated tokens per request.", labels,
                                                   buckets=_TOKEN_BUCKETS, registry=reg)

    def observe_finished(self, output, times) -> None:
        """One finished ``RequestOutput`` with its ``RequestTimes`` (AsyncEngine callback)."""
        m = self.model_name
        prompt_len = len(output.prompt_token_ids or [])
        generated = sum(len(c.token_ids) for c in output.outputs)
        self.prompt_tokens.labels(m).inc(prompt_len)
        self.generation_tokens.labels(m).inc(generated)
        self.request_prompt_tokens.labels(m).observe(prompt_len)
        self.request_generation_tokens.labels(m).observe(generated)
        for choice in output.outputs:
            self.request_success.labels(m, choice.finish_reason or "abort").inc()
        if times.first_output is not None:
            self.ttft.labels(m).observe(times.first_output - times.arrival)
        for gap in times.inter_token_latencies:
            self.itl.labels(m).observe(gap)
        if times.finished is not None:
            self.e2e.labels(m).observe(times.finished - times.arrival)
        metrics = getattr(output, "metrics", None)
        scheduled = getattr(metrics, "first_scheduled_time", None)
        if scheduled is not None:
            self.queue_time.labels(m).observe(max(0.0, scheduled - metrics.arrival_time))

    def observe_abort(self, _request_id: str) -> None:
        self.request_success.labels(self.model_name, "abort").inc()

    def observe_error(self, status: int) -> None:
        self.request_errors.labels(self.model_name, str(status)).inc()

    def observe_constraint(self, params) -> None:
        if params is None:
            return
        for kind in ("choice", "regex", "json", "grammar", "json_object", "structural_tag"):
            if getattr(params, kind, None) not in (None, False):
                self.structured_requests.labels(self.model_name, kind).inc()
                return
