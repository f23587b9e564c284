"""The mask prefetch worker (constrain/prefetch.py): rows built once across threads, built in
the background after a matcher moves, and identical to rows built on the step path."""
import threading
import time

import numpy as np
import pytest

from conformance import smollm2
from tamis.constrain import StructuredOutputsParams, compile_constraint, prefetch
from tamis.constrain.prefetch import OnceCache


def _compile(**kwargs):
    return compile_constraint(StructuredOutputsParams(**kwargs), smollm2()[1])


def _row(matcher):
    bitmask = np.zeros((1, smollm2()[1].num_words), dtype=np.int32)
    matcher.fill_bitmask(bitmask, 0)
    return bitmask[0].copy()


@pytest.fixture
def prefetch_on():
    was = prefetch.enabled()
    prefetch.set_enabled(True)
    yield
    prefetch.WORKER.wait_idle()
    prefetch.set_enabled(was)


def test_once_cache_builds_once_for_concurrent_callers():
    once, store, calls, results = OnceCache(), {}, [], []

    def build():
        calls.append(1)
        time.sleep(0.05)
        return object()
    threads = [threading.Thread(target=lambda: results.append(once.get(store, "k", build)))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
    assert len(results) == 4 and all(r is results[0] for r in results)
    assert store["k"] is results[0]


def test_once_cache_failed_build_is_not_stored_and_waiters_rebuild():
    once, store, attempts = OnceCache(), {}, []
    started = threading.Event()

    def failing():
        attempts.append("fail")
        started.set()
        time.sleep(0.05)
        raise ValueError("boom")
    errors = []

    def first():
        try:
            once.get(store, "k", failing)
        except ValueError as exc:
            errors.append(exc)
    t = threading.Thread(target=first)
    t.start()
    started.wait()
    value = once.get(store, "k", lambda: attempts.append("ok") or "value")
    t.join()
    assert value == "value" and store["k"] == "value"
    assert attempts == ["fail", "ok"] and len(errors) == 1


@pytest.mark.parametrize("kwargs, text", [
    ({"regex": r"(([a-z]{2,10}) ){3}"}, "lorem ipsum dolor "),
    ({"json": {"type": "object", "properties": {"a": {"type": "string", "maxLength": 9},
                                                "b": {}}}}, '{"a":"xyz","b":[1,{"c":null}]}'),
])
def test_worker_builds_the_next_row_and_it_equals_the_step_path_row(prefetch_on, kwargs, text):
    tokenizer, info = smollm2()
    background = _compile(**kwargs)
    prefetch.set_enabled(False)
    reference = _compile(**kwargs)        # its rows are built on the step path only
    ref_matcher = reference.matcher()
    prefetch.set_enabled(True)
    matcher = background.matcher()
    prefetched = 0
    for token in tokenizer.encode(text, add_special_tokens=False):
        assert matcher.accept(token) and ref_matcher.accept(token)
        assert prefetch.WORKER.wait_idle()
        prefetched += _has_mask(matcher)
        np.testing.assert_array_equal(_row(matcher), _row(ref_matcher))
    # every state reached was built by the worker before the step asked for it
    assert prefetched == len(tokenizer.encode(text, add_special_tokens=False))


def _has_mask(matcher) -> bool:
    compiled = matcher.compiled
    if hasattr(compiled, "has_row"):
        return compiled.has_row(matcher.state)
    return all(compiled.has_mask(h) for h in matcher.hypotheses)


def test_disabled_worker_builds_nothing():
    tokenizer, _ = smollm2()
    was = prefetch.enabled()
    prefetch.set_enabled(False)
    try:
        compiled = _compile(regex=r"[a-z]{1,8}( [a-z]{1,8}){0,5}")
        matcher = compiled.matcher()
        for token in tokenizer.encode("abc defg", add_special_tokens=False):
            assert matcher.accept(token)
        time.sleep(0.05)
        assert not compiled.has_row(matcher.state)
        _row(matcher)
        assert compiled.has_row(matcher.state)
    finally:
        prefetch.set_enabled(was)
