"""AsyncEngine over a fake LLMEngine: threading, streaming, abort, back-pressure, failures."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest
from transformers import AutoTokenizer

from fake_engine import FakeEngine
from tamis.engine.async_engine import (AsyncEngine, EngineDeadError, EngineOverloaded,
                                       RequestFailed)
from tamis.engine.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def tokenizer(smollm2_path):
    return AutoTokenizer.from_pretrained(smollm2_path)


def _run(coro):
    return asyncio.run(coro)


def test_generate_streams_cumulative_outputs_from_another_thread(tokenizer):
    fake = FakeEngine(tokenizer)
    engine = AsyncEngine(fake)

    async def main():
        seen = []
        async for out in engine.generate([1, 2, 3], SamplingParams(max_tokens=5), "r1"):
            seen.append(out)
        return seen

    try:
        seen = _run(main())
    finally:
        engine.shutdown()
    assert seen[-1].finished and len(seen[-1].outputs[0].token_ids) == 5
    lengths = [len(o.outputs[0].token_ids) for o in seen]
    assert lengths == sorted(lengths)
    assert fake.thread_ids and threading.get_ident() not in fake.thread_ids
    assert engine.num_in_flight == 0


def test_step_loop_does_not_block_the_event_loop(tokenizer):
    fake = FakeEngine(tokenizer, step_seconds=0.2)
    engine = AsyncEngine(fake)

    async def main():
        gen = engine.generate([1, 2], SamplingParams(max_tokens=5), "slow")
        consumer = asyncio.ensure_future(_drain(gen))
        gaps, last = [], time.monotonic()
        while not consumer.done():
            await asyncio.sleep(0.005)
            now = time.monotonic()
            gaps.append(now - last)
            last = now
        return max(gaps)

    try:
        worst_gap = _run(main())
    finally:
        engine.shutdown()
    # A blocked loop would stall for a whole 200 ms step; the margin absorbs a busy CPU.
    assert worst_gap < 0.1, f"event loop stalled for {worst_gap:.3f}s during 200 ms steps"


async def _drain(gen):
    async for _ in gen:
        pass


def test_leaving_the_stream_aborts_the_request(tokenizer):
    fake = FakeEngine(tokenizer, step_seconds=0.005)
    engine = AsyncEngine(fake)

    async def main():
        async for out in engine.generate([1], SamplingParams(max_tokens=1000), "gone"):
            if len(out.outputs[0].token_ids) >= 3:
                break
        for _ in range(100):
            if "gone" in fake.aborted:
                return
            await asyncio.sleep(0.01)

    try:
        _run(main())
    finally:
        engine.shutdown()
    assert fake.aborted == ["gone"]
    assert not fake.requests and engine.num_in_flight == 0


def test_full_waiting_queue_raises_overloaded(tokenizer):
    fake = FakeEngine(tokenizer, step_seconds=0.02, max_running=1)
    engine = AsyncEngine(fake, max_waiting=2)

    async def main():
        gens = [engine.generate([1], SamplingParams(max_tokens=3), f"r{i}") for i in range(2)]
        firsts = [asyncio.ensure_future(anext(g)) for g in gens]
        await asyncio.sleep(0)  # both admitted, neither has output yet
        with pytest.raises(EngineOverloaded, match="--max-waiting 2"):
            await anext(engine.generate([1], SamplingParams(max_tokens=3), "r2"))
        await asyncio.gather(*firsts)
        for g in gens:
            await g.aclose()

    try:
        _run(main())
    finally:
        engine.shutdown()


def test_rejected_and_failed_requests_raise_in_the_consumer(tokenizer):
    fake = FakeEngine(tokenizer)
    engine = AsyncEngine(fake)

    async def main():
        bad_add = SamplingParams(max_tokens=3, extra_args={"fail_on_add": True})
        with pytest.raises(RequestFailed, match="fail_on_add"):
            await anext(engine.generate([1], bad_add, "a"))
        bad_run = SamplingParams(max_tokens=3, extra_args={"fail_in_engine": True})
        with pytest.raises(RequestFailed, match="grammar failed"):
            await anext(engine.generate([1], bad_run, "b"))
        outs = [o async for o in engine.generate([1], SamplingParams(max_tokens=2), "c")]
        assert outs[-1].finished

    try:
        _run(main())
    finally:
        engine.shutdown()
    assert engine.num_in_flight == 0


def test_crashed_step_loop_fails_requests_and_health(tokenizer):
    fake = FakeEngine(tokenizer)
    engine = AsyncEngine(fake)
    fake.fail_next_step = RuntimeError("boom")

    async def main():
        with pytest.raises(EngineDeadError, match="boom"):
            await anext(engine.generate([1], SamplingParams(max_tokens=2), "x"))

    _run(main())
    engine.shutdown()
    assert not engine.is_alive
    with pytest.raises(EngineDeadError):
        engine.check_health()


def test_a_compile_time_limit_is_a_503_with_its_code(tokenizer):
    from tamis.server.errors import engine_error
    engine = AsyncEngine(FakeEngine(tokenizer))

    async def main():
        slow = SamplingParams(max_tokens=3, extra_args={"fail_in_engine": True,
                                                         "error_code": "compile_time_limit"})
        with pytest.raises(RequestFailed) as caught:
            await anext(engine.generate([1], slow, "slow"))
        return caught.value

    try:
        failed = _run(main())
    finally:
        engine.shutdown()
    error = engine_error(failed)
    assert (error.status, error.code, error.type) == (503, "compile_time_limit", "server_error")
    wrong = engine_error(RequestFailed("bad schema"))
    assert (wrong.status, wrong.type) == (400, "invalid_request_error")
