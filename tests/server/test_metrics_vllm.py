"""/metrics speaks vLLM 0.26's V1 logger: its names, labels and buckets, under a namespace."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tamis.engine.async_engine import RequestTimes
from tamis.engine.outputs import RequestMetrics
from tamis.engine.sampling_params import SamplingParams
from tamis.engine.stats import ITERATION_TOKEN_BUCKETS, CumulativeHistogram, EngineStats
from tamis.server.metrics import ServerMetrics, one_two_five_buckets

# Every series vLLM 0.26's PrometheusStatLogger registers without optional features
# (LoRA, speculative decoding, KV connector stats, KV residency sampling), with its type.
VLLM_METRICS = {
    "num_requests_running": "gauge", "num_requests_waiting": "gauge",
    "num_requests_waiting_by_reason": "gauge", "engine_sleep_state": "gauge",
    "kv_cache_usage_perc": "gauge", "cache_config_info": "gauge",
    "prefix_cache_queries": "counter", "prefix_cache_hits": "counter",
    "external_prefix_cache_queries": "counter", "external_prefix_cache_hits": "counter",
    "mm_cache_queries": "counter", "mm_cache_hits": "counter",
    "num_preemptions": "counter", "prompt_tokens": "counter",
    "prompt_tokens_by_source": "counter", "prompt_tokens_cached": "counter",
    "generation_tokens": "counter", "request_success": "counter",
    "request_prompt_tokens": "histogram", "request_generation_tokens": "histogram",
    "iteration_tokens_total": "histogram", "request_max_num_generation_tokens": "histogram",
    "request_params_n": "histogram", "request_params_max_tokens": "histogram",
    "time_to_first_token_seconds": "histogram", "inter_token_latency_seconds": "histogram",
    "request_time_per_output_token_seconds": "histogram",
    "e2e_request_latency_seconds": "histogram", "request_queue_time_seconds": "histogram",
    "request_inference_time_seconds": "histogram", "request_prefill_time_seconds": "histogram",
    "request_decode_time_seconds": "histogram",
    "request_prefill_kv_computed_tokens": "histogram",
}
# vLLM 0.26's buckets, as its logger writes them.
VLLM_BUCKETS = {
    "time_to_first_token_seconds": [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
                                    0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0,
                                    640.0, 2560.0],
    "inter_token_latency_seconds": [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
                                    0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0],
    "e2e_request_latency_seconds": [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0,
                                    30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0,
                                    1920.0, 7680.0],
    "iteration_tokens_total": [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384],
    "request_params_n": [1, 2, 5, 10, 20],
    "request_prompt_tokens": [1, 2, 5, 10, 20, 50, 100, 200],   # max_model_len 256
}
LABELS = {"model_name": "m", "engine": "0"}


def _stats(**overrides) -> EngineStats:
    values = dict(num_running=2, num_waiting=5, kv_cache_usage=0.25, num_free_blocks=30,
                  num_total_blocks=40, prefix_cache_queries=100, prefix_cache_hits=60,
                  num_preemptions=1, num_prompt_tokens=70, num_waiting_for_grammar=2,
                  iteration_tokens=CumulativeHistogram(ITERATION_TOKEN_BUCKETS))
    values.update(overrides)
    return EngineStats(**values)


def _metrics(namespace="tamis", stats=None) -> ServerMetrics:
    engine = SimpleNamespace(last_stats=stats if stats is not None else _stats(),
                             num_in_flight=0, engine=None)
    return ServerMetrics(engine, "m", max_model_len=256, namespace=namespace)


def _families(metrics: ServerMetrics) -> dict:
    text = generate_latest(metrics.registry).decode()
    return {family.name: family for family in text_string_to_metric_families(text)}


def _value(metrics: ServerMetrics, name: str, **labels) -> float | None:
    return metrics.registry.get_sample_value(name, {**LABELS, **labels})


@pytest.mark.parametrize("namespace", ["vllm", "tamis"])
def test_every_vllm_metric_is_served_with_its_type_and_labels(namespace):
    families = _families(_metrics(namespace))
    for name, kind in VLLM_METRICS.items():
        # The parser drops a counter's `_total`; vLLM's histogram keeps it in its name.
        family = families.get(f"{namespace}:{name}")
        assert family is not None, f"{namespace}:{name} missing"
        assert family.type == kind, name
        assert family.samples, f"{name} has no series"
        if name != "cache_config_info":
            assert all(s.labels["model_name"] == "m" and s.labels["engine"] == "0"
                       for s in family.samples), name


def test_buckets_are_vllms():
    families = _families(_metrics("vllm"))
    for name, buckets in VLLM_BUCKETS.items():
        bounds = [float(s.labels["le"]) for s in families[f"vllm:{name}"].samples
                  if s.name.endswith("_bucket")]
        assert bounds == [float(b) for b in buckets] + [float("inf")], name
    assert one_two_five_buckets(2048)[-3:] == (500, 1000, 2000)
    assert one_two_five_buckets(1000)[-1] == 1000


def test_finished_request_phases_follow_vllms_definitions():
    metrics = _metrics()
    times = RequestTimes(arrival=10.0, first_output=10.5, last_output=12.0, finished=12.1)
    times.inter_token_latencies = [0.5, 1.0]
    engine_times = RequestMetrics(arrival_time=100.0, first_scheduled_time=100.25,
                                  first_token_time=100.75, last_token_time=102.75,
                                  max_tokens=50)
    choices = [SimpleNamespace(token_ids=[1] * 5, finish_reason="stop"),
               SimpleNamespace(token_ids=[1] * 9, finish_reason="length")]
    output = SimpleNamespace(prompt_token_ids=[1] * 12, outputs=choices, metrics=engine_times,
                             num_cached_tokens=4)
    metrics.observe_finished(output, times)
    expect = {
        "tamis:request_queue_time_seconds_sum": 0.25,
        "tamis:request_prefill_time_seconds_sum": 0.5,
        "tamis:request_decode_time_seconds_sum": 2.0,
        "tamis:request_inference_time_seconds_sum": 2.5,
        "tamis:request_time_per_output_token_seconds_sum": 2.0 / 4,   # first sequence: 5 tokens
        "tamis:time_to_first_token_seconds_sum": 0.5,
        "tamis:e2e_request_latency_seconds_sum": 2.1,
        "tamis:inter_token_latency_seconds_count": 2,
        "tamis:request_params_n_sum": 2,
        "tamis:request_max_num_generation_tokens_sum": 9,
        "tamis:request_params_max_tokens_sum": 100,           # per sequence, as vLLM
        "tamis:request_prompt_tokens_sum": 24,
        "tamis:request_generation_tokens_sum": 14,
        "tamis:request_prefill_kv_computed_tokens_sum": 2 * (12 - 4),
        "tamis:generation_tokens_total": 14,
    }
    for name, value in expect.items():
        assert _value(metrics, name) == pytest.approx(value), name
    assert _value(metrics, "tamis:request_success_total", finished_reason="stop") == 1
    assert _value(metrics, "tamis:request_success_total", finished_reason="length") == 1
    assert _value(metrics, "tamis:request_success_total", finished_reason="repetition") == 0


def test_engine_state_at_scrape_time():
    histogram = CumulativeHistogram(ITERATION_TOKEN_BUCKETS)
    for tokens in (1, 8, 9, 20000):
        histogram.observe(tokens)
    metrics = _metrics("vllm", _stats(iteration_tokens=histogram))
    assert _value(metrics, "vllm:num_requests_waiting_by_reason", reason="capacity") == 3
    assert _value(metrics, "vllm:num_requests_waiting_by_reason", reason="deferred") == 2
    assert _value(metrics, "vllm:prompt_tokens_by_source_total", source="local_compute") == 70
    assert _value(metrics, "vllm:prompt_tokens_by_source_total", source="local_cache_hit") == 60
    assert _value(metrics, "vllm:prompt_tokens_cached_total") == 60
    assert _value(metrics, "vllm:engine_sleep_state", sleep_state="awake") == 1
    assert _value(metrics, "vllm:iteration_tokens_total_bucket", le="1.0") == 1
    assert _value(metrics, "vllm:iteration_tokens_total_bucket", le="8.0") == 2
    assert _value(metrics, "vllm:iteration_tokens_total_bucket", le="16.0") == 3
    assert _value(metrics, "vllm:iteration_tokens_total_bucket", le="16384.0") == 3
    assert _value(metrics, "vllm:iteration_tokens_total_bucket", le="+Inf") == 4
    assert _value(metrics, "vllm:iteration_tokens_total_sum") == 1 + 8 + 9 + 20000
    info = metrics.registry.get_sample_value("vllm:cache_config_info", {
        "engine": "0", "block_size": "None", "cache_dtype": "auto",
        "enable_prefix_caching": "None", "gpu_memory_utilization": "None",
        "num_gpu_blocks": "40", "num_gpu_blocks_override": "None", "num_cpu_blocks": "None"})
    assert info == 1


def test_namespace_must_be_a_prometheus_name():
    with pytest.raises(ValueError, match="metrics namespace"):
        _metrics("my-dashboards")


def test_engine_counts_tokens_per_step_and_keeps_max_tokens(tiny_checkpoint):
    from tamis.engine.engine import LLMEngine

    engine = LLMEngine(model=str(tiny_checkpoint("llama")), kv_cache_memory_bytes="64MiB")
    prompts = [[5, 6, 7, 8, 9], [10, 11, 12]]
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        engine.add_request(f"r{i}", prompt, params)
    steps, finished = 0, []
    while engine.has_unfinished_requests():
        finished += [o for o in engine.step() if o.finished]
        steps += 1
    histogram = engine.get_stats().iteration_tokens
    # Each prompt once, then one token a step for each token after the first.
    assert histogram.total == sum(len(p) + params.max_tokens - 1 for p in prompts)
    assert histogram.count == steps
    assert [o.metrics.max_tokens for o in finished] == [4, 4]
