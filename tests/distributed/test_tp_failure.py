"""A tensor-parallel rank that dies or hangs mid-run ends the engine with an error
naming it, within a bounded time, and leaves no rank process behind."""
from __future__ import annotations

import os
import signal
import time

import pytest

from tamis.engine.distributed.workers import RankFailedError
from tp_helpers import greedy, make_engine

# A hung rank fails its peers' collectives after this long (TAMIS_DISTRIBUTED_TIMEOUT_S).
COLLECTIVE_TIMEOUT_S = 5
BOUND_S = 30


def _step_until_error(engine) -> tuple[RankFailedError, float]:
    start = time.monotonic()
    with pytest.raises(RankFailedError) as caught:
        while time.monotonic() - start < BOUND_S and engine.has_unfinished_requests():
            engine.step()
    return caught.value, time.monotonic() - start


@pytest.fixture
def engine(tiny_checkpoint, monkeypatch):
    monkeypatch.setenv("TAMIS_DISTRIBUTED_TIMEOUT_S", str(COLLECTIVE_TIMEOUT_S))
    built = make_engine(tiny_checkpoint("llama"), 2)
    for index in range(2):
        built.add_request(f"r{index}", {"prompt_token_ids": list(range(100 + index, 130))},
                          greedy(200, logprobs=None))
    for _ in range(3):   # mid-run: prompts computed, decoding
        built.step()
    yield built
    built.shutdown()


@pytest.mark.parametrize("how", ["killed", "hung"])
def test_a_rank_that_dies_or_hangs_ends_the_engine(engine, how):
    worker = engine.runner.workers.processes[1]
    os.kill(worker.pid, signal.SIGKILL if how == "killed" else signal.SIGSTOP)
    error, elapsed = _step_until_error(engine)
    assert elapsed < (2 if how == "killed" else COLLECTIVE_TIMEOUT_S + 10)
    assert "engine stopped" in str(error)
    if how == "killed":
        assert "rank 1" in str(error) and "SIGKILL" in str(error)
    worker.join(10)
    assert not worker.is_alive()   # a hung rank is killed, not left behind
