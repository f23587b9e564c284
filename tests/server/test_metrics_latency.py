"""Latency histograms: one inter-token observation per output step, as vLLM records them."""
from __future__ import annotations

from types import SimpleNamespace

from tamis.engine.async_engine import RequestTimes, _record_progress, _Stream
from tamis.server.metrics import ServerMetrics


def _output(num_tokens: int, finished: bool = False):
    choice = SimpleNamespace(token_ids=list(range(num_tokens)), finish_reason="length" if finished else None)
    return SimpleNamespace(error=None, outputs=[choice], prompt_token_ids=[1, 2, 3], metrics=None)


def test_each_output_step_after_the_first_is_one_inter_token_sample():
    stream = _Stream.__new__(_Stream)
    stream.times = RequestTimes()
    for num_tokens in (1, 2, 4, 5):          # four steps, one of them jumps forward two tokens
        _record_progress(stream, _output(num_tokens))
    assert len(stream.times.inter_token_latencies) == 3
    assert all(gap >= 0.0 for gap in stream.times.inter_token_latencies)

    metrics = ServerMetrics(SimpleNamespace(last_stats=None, num_in_flight=0), "m")
    metrics.observe_finished(_output(5, finished=True), stream.times)
    count = metrics.registry.get_sample_value("tamis:inter_token_latency_seconds_count", {"model_name": "m", "engine": "0"})
    assert count == 3
