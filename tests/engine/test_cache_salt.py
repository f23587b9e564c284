"""cache_salt: prefix-cache hits only between requests of the same salt."""
from __future__ import annotations

import random

import pytest

from engine_helpers import make_engine
from tamis.engine.sampling_params import SamplingParams

PARAMS = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)


def _run(engine, request_id: str, prompt: list[int], salt: str | None = None):
    engine.add_request(request_id, {"prompt_token_ids": prompt, "cache_salt": salt}
                       if salt is not None else prompt, PARAMS)
    final = None
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                final = output
    return final


@pytest.fixture(scope="module")
def engine(tiny_checkpoint):
    return make_engine(tiny_checkpoint("llama"))


def _prompt(seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(100, 49152) for _ in range(50)]   # 3 full blocks of 16


def test_same_salt_hits_other_salts_miss(engine):
    prompt = _prompt(1)
    first = _run(engine, "a1", prompt, salt="alice")
    assert first.num_cached_tokens == 0
    again = _run(engine, "a2", prompt, salt="alice")
    assert again.num_cached_tokens == 48
    other = _run(engine, "b1", prompt, salt="bob")
    assert other.num_cached_tokens == 0
    unsalted = _run(engine, "n1", prompt)
    assert unsalted.num_cached_tokens == 0
    # The salt changes where blocks are cached, never what is generated.
    outputs = {tuple(o.outputs[0].token_ids) for o in (first, again, other, unsalted)}
    assert len(outputs) == 1


def test_unsalted_requests_still_share(engine):
    prompt = _prompt(2)
    _run(engine, "u1", prompt)
    assert _run(engine, "u2", prompt).num_cached_tokens == 48
    assert _run(engine, "s1", prompt, salt="carol").num_cached_tokens == 0


def test_salt_must_be_a_non_empty_string(engine):
    for salt in ("", 7):
        with pytest.raises(ValueError, match="cache_salt"):
            engine.add_request("bad", {"prompt_token_ids": [1, 2, 3], "cache_salt": salt}, PARAMS)
    assert not engine.has_unfinished_requests()
