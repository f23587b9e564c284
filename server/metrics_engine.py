"""Engine state for /metrics, read at scrape time from the step loop's latest ``EngineStats``.

vLLM's names and labels (``model_name``, ``engine``) under the server's namespace, plus
tamis's own (KV block counts, requests in flight, structured-output figures). Series of
features tamis does not have (external KV connector, multi-modal cache) are exported at 0
as vLLM exports them when unused, so dashboards that read them find a value.
"""
from __future__ import annotations

from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily,
                                    HistogramMetricFamily)

LABELS = ["model_name", "engine"]
ENGINE_INDEX = "0"   # one engine per server (vLLM numbers its data-parallel engines)

# (name, help, EngineStats attribute)
_GAUGES = [
    ("num_requests_running", "Number of requests in model execution batches.", "num_running"),
    ("num_requests_waiting", "Number of requests waiting to be processed.", "num_waiting"),
    ("kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", "kv_cache_usage"),
    ("kv_cache_free_blocks", "Free KV cache blocks.", "num_free_blocks"),
    ("kv_cache_total_blocks", "Total KV cache blocks.", "num_total_blocks"),
]
_COUNTERS = [
    ("prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.",
     "prefix_cache_queries"),
    ("prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
     "prefix_cache_hits"),
    ("prompt_tokens_cached", "Number of cached prompt tokens (local + external).",
     "prefix_cache_hits"),
    ("num_preemptions", "Cumulative number of preemption from the engine.", "num_preemptions"),
    ("structured_output_compiles", "Grammars compiled.", "structured_output_compiles"),
    ("structured_output_cache_hits", "Grammar compilations served from the cache.",
     "structured_output_cache_hits"),
    ("structured_output_compile_seconds", "Total seconds spent compiling grammars.",
     "structured_output_compile_seconds"),
    ("structured_output_mask_seconds", "Total seconds spent filling token bitmasks.",
     "structured_output_mask_seconds"),
]
_ALWAYS_ZERO = [
    ("external_prefix_cache_queries", "External prefix cache queries from KV connector "
     "cross-instance cache sharing, in terms of number of queried tokens."),
    ("external_prefix_cache_hits", "External prefix cache hits from KV connector "
     "cross-instance cache sharing, in terms of number of cached tokens."),
    ("mm_cache_queries", "Multi-modal cache queries, in terms of number of queried items."),
    ("mm_cache_hits", "Multi-modal cache hits, in terms of number of cached items."),
]


class EngineCollector:
    """A Prometheus collector over ``async_engine.last_stats`` (None before the first step:
    only series that need no stats are exported then)."""

    def __init__(self, async_engine, model_name: str, namespace: str):
        self.async_engine = async_engine
        self.labels = [model_name, ENGINE_INDEX]
        self.prefix = f"{namespace}:"

    def collect(self):
        stats = self.async_engine.last_stats
        yield from self._state(stats)
        yield from self._counters(stats)
        yield self._waiting_by_reason(stats)
        yield self._sleep_state()
        yield self._iteration_tokens(stats)
        yield self._cache_config_info(stats)
        yield self._gauge("num_requests_in_flight", "Requests the server is streaming or "
                          "waiting on.", self.async_engine.num_in_flight)

    def _state(self, stats):
        for name, doc, attr in _GAUGES:
            value = getattr(stats, attr, None)
            if value is None and attr == "num_running" and stats is None:
                value = 0   # nothing has run yet
            yield self._gauge(name, doc, value)

    def _counters(self, stats):
        for name, doc, attr in _COUNTERS:
            yield self._counter(name, doc, getattr(stats, attr, None))
        for name, doc in _ALWAYS_ZERO:
            yield self._counter(name, doc, 0)
        by_source = CounterMetricFamily(self.prefix + "prompt_tokens_by_source",
                                        "Number of prompt tokens by source.",
                                        labels=LABELS + ["source"])
        if stats is not None:
            sources = {"local_compute": getattr(stats, "num_prompt_tokens", 0),
                       "local_cache_hit": getattr(stats, "prefix_cache_hits", 0),
                       "external_kv_transfer": 0}
            for source, value in sources.items():
                by_source.add_metric(self.labels + [source], value)
        yield by_source

    def _waiting_by_reason(self, stats) -> GaugeMetricFamily:
        family = GaugeMetricFamily(
            self.prefix + "num_requests_waiting_by_reason",
            "Number of waiting requests by reason: 'capacity' = waiting for scheduling "
            "capacity; 'deferred' = held until their grammar compiles.",
            labels=LABELS + ["reason"])
        if stats is not None:
            deferred = getattr(stats, "num_waiting_for_grammar", 0)
            family.add_metric(self.labels + ["capacity"], stats.num_waiting - deferred)
            family.add_metric(self.labels + ["deferred"], deferred)
        return family

    def _sleep_state(self) -> GaugeMetricFamily:
        family = GaugeMetricFamily(
            self.prefix + "engine_sleep_state",
            "Engine sleep state; awake = 1 means the engine is awake (tamis engines do "
            "not sleep).", labels=LABELS + ["sleep_state"])
        for state, value in (("awake", 1), ("weights_offloaded", 0), ("discard_all", 0)):
            family.add_metric(self.labels + [state], value)
        return family

    def _iteration_tokens(self, stats) -> HistogramMetricFamily:
        family = HistogramMetricFamily(self.prefix + "iteration_tokens_total",
                                       "Histogram of number of tokens per engine_step.",
                                       labels=LABELS)
        histogram = getattr(stats, "iteration_tokens", None)
        if histogram is not None:
            running, buckets = 0, []
            for bound, count in zip(list(histogram.bounds) + [float("inf")], histogram.counts):
                running += count
                buckets.append((_bound_text(bound), running))
            family.add_metric(self.labels, buckets, histogram.total)
        return family

    def _cache_config_info(self, stats) -> GaugeMetricFamily:
        info = cache_config_info(getattr(self.async_engine, "engine", None), stats)
        family = GaugeMetricFamily(self.prefix + "cache_config_info",
                                   "Information of the LLMEngine CacheConfig",
                                   labels=list(info) + ["engine"])
        family.add_metric(list(info.values()) + [ENGINE_INDEX], 1)
        return family

    def _gauge(self, name: str, doc: str, value) -> GaugeMetricFamily:
        family = GaugeMetricFamily(self.prefix + name, doc, labels=LABELS)
        if value is not None:
            family.add_metric(self.labels, float(value))
        return family

    def _counter(self, name: str, doc: str, value) -> CounterMetricFamily:
        family = CounterMetricFamily(self.prefix + name, doc, labels=LABELS)
        if value is not None:
            family.add_metric(self.labels, float(value))
        return family


def cache_config_info(engine, stats) -> dict[str, str]:
    """The KV-cache settings under vLLM's ``CacheConfig`` field names, as strings (vLLM's
    ``str(value)``: ``"True"``, ``"None"``, ``"0.9"``)."""
    config = getattr(engine, "config", None)
    num_blocks = getattr(getattr(engine, "kv_cache", None), "num_blocks", None)
    if num_blocks is None:
        num_blocks = getattr(stats, "num_total_blocks", None)
    values = {
        "block_size": getattr(config, "block_size", None),
        "cache_dtype": getattr(config, "kv_cache_dtype", "auto"),
        "enable_prefix_caching": getattr(config, "enable_prefix_caching", None),
        "gpu_memory_utilization": getattr(config, "gpu_memory_utilization", None),
        "num_gpu_blocks": num_blocks,
        "num_gpu_blocks_override": getattr(config, "num_gpu_blocks_override", None),
        "num_cpu_blocks": None,
    }
    return {name: str(value) for name, value in values.items()}


def _bound_text(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(float(bound))
