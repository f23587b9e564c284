"""The engine core in its own process (``ProcessCore``), driven through ``AsyncEngine`` in
this process: its outputs equal the in-process core's (greedy, embedded SmolLM2), request
errors keep their kind, and a core that raises or dies fails every request with
``EngineDeadError``, never a hang. ``test_core_process_serve.py`` drives ``tamis serve``."""
from __future__ import annotations

import asyncio
import functools
import os
import signal
import time

import pytest

from tamis.constrain import StructuredOutputsParams
from tamis.engine.async_engine import (AsyncEngine, EngineDeadError, RequestFailed)
from tamis.engine.config import EngineConfig
from tamis.engine.core import ProcessCore, ThreadCore
from tamis.engine.core.process import EngineCoreStartError
from tamis.engine.engine import LLMEngine
from tamis.engine.sampling_params import SamplingParams

ENGINE_ARGS = dict(model=None, kv_cache_memory_bytes="64MiB", max_model_len=512, seed=0)
PROMPTS = ["The capital of France is", "Once upon a time", "1, 2, 3, 4,"]


def _params(period_id: int) -> list[SamplingParams]:
    """One of each output shape: plain, logprobs + prompt logprobs, n=2 seeded sampling,
    stop strings (kept, held back and cut, with logprobs, after min_tokens, in one of two
    choices), a stop token id, a regex constraint."""
    return [SamplingParams(max_tokens=12, temperature=0),
            SamplingParams(max_tokens=6, temperature=0, logprobs=3, prompt_logprobs=2),
            SamplingParams(max_tokens=8, temperature=0.8, n=2, seed=7),
            SamplingParams(max_tokens=24, temperature=0, stop=[".", " and"],
                           include_stop_str_in_output=True),
            SamplingParams(max_tokens=24, temperature=0, stop=[" the", ","], logprobs=1),
            SamplingParams(max_tokens=24, temperature=0, stop=[" "], min_tokens=3),
            SamplingParams(max_tokens=16, temperature=1.0, n=2, seed=3, stop=["e"]),
            SamplingParams(max_tokens=30, temperature=0, stop_token_ids=[period_id]),
            SamplingParams(max_tokens=10, temperature=0,
                           structured_outputs=StructuredOutputsParams(regex=r"[a-z]{3,6}"))]


class CrashingEngine(LLMEngine):
    """Its step raises once a request whose id starts with ``crash`` is in the engine."""

    def step(self):
        if any(request_id.startswith("crash") for request_id in self.outputs.groups):
            raise RuntimeError("boom in step")
        return super().step()


def _config() -> EngineConfig:
    return EngineConfig.from_kwargs(**ENGINE_ARGS)


def _spawn(make_engine=None) -> ProcessCore:
    """A core process with one torch thread (as ``live_server``'s): on a shared 2-core
    runner, two threads of a process's main thread spin against each other (10x slower)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMP_NUM_THREADS", "1")
        return ProcessCore(make_engine or functools.partial(LLMEngine, _config()),
                           start_timeout=300)


@pytest.fixture(scope="module")
def process_engine():
    engine = AsyncEngine(_spawn())
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def thread_engine():
    """The in-process core, with the core process's one torch thread: the same sums in
    the same order, so the same logprobs to the last bit."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    engine = AsyncEngine(ThreadCore(LLMEngine(_config())))
    try:
        yield engine
    finally:
        engine.shutdown()
        torch.set_num_threads(threads)


async def _collect(engine: AsyncEngine, prompt, params, request_id: str) -> list:
    return [output async for output in engine.generate(prompt, params, request_id)]


def _run_all(engine: AsyncEngine) -> list[list]:
    period_id = engine.tokenizer.convert_tokens_to_ids(".")

    # One request at a time: a batch's composition changes float32 logits in the last
    # bits, enough to flip a near tie, and concurrent arrivals batch by timing.
    async def main():
        return [await _collect(engine, prompt, params, f"r{i}-{j}")
                for i, prompt in enumerate(PROMPTS)
                for j, params in enumerate(_params(period_id))]
    return asyncio.run(main())


def _wait_until_idle(engine: AsyncEngine, timeout: float = 30):
    """The core's stats once no request runs and every block is free (or at the timeout)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stats = engine.last_stats
        if stats.num_running == 0 and stats.num_free_blocks == stats.num_total_blocks:
            break
        time.sleep(0.05)
    return engine.last_stats


def _final(output) -> tuple:
    return (output.prompt, output.prompt_token_ids, output.prompt_logprobs,
            output.num_cached_tokens, output.error,
            [(c.index, c.text, c.token_ids, c.cumulative_logprob, c.logprobs, c.finish_reason,
              c.stop_reason) for c in output.outputs])


def test_outputs_equal_the_in_process_core(process_engine, thread_engine):
    remote, local = _run_all(process_engine), _run_all(thread_engine)
    for remote_outputs, local_outputs in zip(remote, local):
        final = remote_outputs[-1]
        assert final.finished and all(not o.finished for o in remote_outputs[:-1])
        assert _final(final) == _final(local_outputs[-1])
        for earlier in remote_outputs[:-1]:   # cumulative: each output extends the last
            for choice, last in zip(earlier.outputs, final.outputs):
                assert last.token_ids[:len(choice.token_ids)] == choice.token_ids
                assert last.text.startswith(choice.text)
    assert any(len(outputs) > 2 for outputs in remote), "no request streamed several outputs"
    reasons = [c.stop_reason for outputs in remote for c in outputs[-1].outputs]
    assert any(isinstance(r, str) for r in reasons), "no stop string ended a request"
    assert any(isinstance(r, int) for r in reasons), "no stop token id ended a request"
    assert process_engine.num_in_flight == 0
    stats = _wait_until_idle(process_engine)   # requests a stop string ended are aborted
    assert stats.num_running == 0 and stats.num_free_blocks == stats.num_total_blocks
    # Requests a stop string ended here were aborted in the core, not finished there.
    ended_in_core = [o for o in remote if not any(isinstance(c.stop_reason, str)
                                                  for c in o[-1].outputs)]
    assert stats.num_finished_requests >= len(ended_in_core)


def test_request_errors_keep_their_kind(process_engine):
    async def main():
        with pytest.raises(RequestFailed, match="out of vocabulary") as bad_id:
            await _collect(process_engine, [10 ** 9], SamplingParams(max_tokens=2), "bad-id")
        bad_regex = SamplingParams(max_tokens=4, structured_outputs=StructuredOutputsParams(
            regex="(unclosed"))
        with pytest.raises(RequestFailed) as bad_grammar:
            await _collect(process_engine, "Say:", bad_regex, "bad-regex")
        good = await _collect(process_engine, "Hi", SamplingParams(max_tokens=2), "good")
        return bad_id.value, bad_grammar.value, good

    bad_id, bad_grammar, good = asyncio.run(main())
    assert bad_id.code is None and bad_grammar.code is None   # the request's fault: 400s
    assert good[-1].finished and len(good[-1].outputs[0].token_ids) == 2


def test_leaving_the_stream_frees_the_request_in_the_core(process_engine):
    long = SamplingParams(max_tokens=400, ignore_eos=True, temperature=0)

    async def main():
        async for output in process_engine.generate("Tell a story:", long, "leaver"):
            if len(output.outputs[0].token_ids) >= 3:
                used = process_engine.last_stats.num_total_blocks - \
                    process_engine.last_stats.num_free_blocks
                break
        return used

    used = asyncio.run(main())
    stats = _wait_until_idle(process_engine)
    assert used > 0
    assert stats.num_running == 0 and stats.num_free_blocks == stats.num_total_blocks
    assert process_engine.num_in_flight == 0


def test_a_core_that_raises_fails_every_request_and_calls_on_dead():
    core = _spawn(functools.partial(CrashingEngine, _config()))
    deaths = []
    engine = AsyncEngine(core, on_dead=deaths.append)

    async def main():
        ok = asyncio.ensure_future(_collect(engine, "Count:", SamplingParams(
            max_tokens=300, ignore_eos=True), "long"))
        await asyncio.sleep(0.5)
        with pytest.raises(EngineDeadError, match="boom in step"):
            await _collect(engine, "Hi", SamplingParams(max_tokens=2), "crash-1")
        with pytest.raises(EngineDeadError, match="boom in step"):
            await ok
        with pytest.raises(EngineDeadError):
            await _collect(engine, "Hi", SamplingParams(max_tokens=2), "after")

    try:
        asyncio.run(asyncio.wait_for(main(), 120))
        core.process.join(30)
        assert core.process.exitcode == 1
        assert not engine.is_alive and len(deaths) == 1 and "boom in step" in deaths[0]
    finally:
        engine.shutdown()


def test_a_killed_core_fails_in_flight_requests_without_a_hang():
    core = _spawn()
    engine = AsyncEngine(core)

    async def main():
        started = time.monotonic()
        with pytest.raises(EngineDeadError, match="SIGKILL"):
            async for output in engine.generate("Go:", SamplingParams(
                    max_tokens=400, ignore_eos=True), "victim"):
                if len(output.outputs[0].token_ids) == 2:
                    os.kill(core.process.pid, signal.SIGKILL)
        return time.monotonic() - started

    try:
        elapsed = asyncio.run(asyncio.wait_for(main(), 120))
        assert elapsed < 60
        with pytest.raises(EngineDeadError):
            engine.check_health()
    finally:
        engine.shutdown()


def test_a_model_that_cannot_load_fails_the_constructor_with_the_cores_error(tmp_path):
    config = EngineConfig.from_kwargs(**{**ENGINE_ARGS, "model": str(tmp_path / "missing")})
    with pytest.raises(Exception) as in_process:
        LLMEngine(config)
    started = time.monotonic()
    with pytest.raises(type(in_process.value)) as remote:
        _spawn(functools.partial(LLMEngine, config))
    assert str(remote.value) == str(in_process.value)
    assert time.monotonic() - started < 120
    assert not isinstance(remote.value, EngineCoreStartError)
