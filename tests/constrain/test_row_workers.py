"""constrain/row_workers.py: mask rows built in worker processes equal the in-process ones,
and a pool that loses a worker falls back to building rows in-process."""
import copy
import random
import time

import numpy as np
import pytest

from conformance import smollm2
from tamis.constrain import StructuredOutputsParams, compile_constraint
from tamis.constrain.automaton import LazyDFA
from tamis.constrain.prefetch import OnceCache
from tamis.constrain.row_workers import RowWorkers

ITEMS = {"type": "object", "properties": {"items": {"type": "array", "minItems": 3, "items": {
    "type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                     "qty": {"type": "integer"}},
    "required": ["name", "qty"], "additionalProperties": False}}},
    "required": ["items"], "additionalProperties": False}


def _reached_states(compiled, walks: int, steps: int) -> list[int]:
    """States reached by random token walks (the rows they need are built in-process)."""
    rng = random.Random(0)
    info = compiled.info
    states = set()
    for _ in range(walks):
        matcher = compiled.matcher()
        for _ in range(steps):
            row = np.zeros((1, info.num_words), dtype=np.int32)
            matcher.fill_bitmask(row, 0)
            bits = np.unpackbits(row[0].view(np.uint8), bitorder="little")[:info.vocab_size]
            allowed = [t for t in np.flatnonzero(bits).tolist() if t not in info.eos_token_ids]
            if not allowed:
                break
            assert matcher.accept(rng.choice(allowed))
            states.add(matcher.state)
    return sorted(states)


def _twin(compiled):
    """``compiled`` again over the very same NFA, no row cached, its states numbered anew.
    (Two compiles of one constraint may build different NFAs of the same language: a
    fragment minimized during one compile is pasted minimized in the next.)"""
    twin = copy.copy(compiled)
    dfa = LazyDFA.from_nfa(compiled.dfa.nfa, compiled.dfa.nfa_accept)
    dfa.start = dfa.state_of_set(compiled.dfa.sets[compiled.dfa.start])
    twin.dfa, twin._rows, twin._once = dfa, {}, OnceCache()
    return twin


@pytest.fixture(scope="module")
def info():
    return smollm2()[1]


@pytest.mark.parametrize("params", [{"json": ITEMS}, {"regex": r"(([a-z]{2,6}) ){12}"}])
def test_worker_rows_equal_in_process_rows(info, params):
    reference = compile_constraint(StructuredOutputsParams(**params), info)
    states = _reached_states(reference, walks=3, steps=12)
    fresh = _twin(reference)
    sets = [reference.dfa.sets[s] for s in states]
    fresh_states = [fresh.dfa.state_of_set(nfa_set) for nfa_set in sets]
    workers = RowWorkers(info, 2)
    assert workers.wait_ready(60)
    try:
        workers.build(fresh, fresh_states)
        assert not workers.broken and workers.rows_built == len(states)
        for ours, theirs in zip(states, fresh_states):
            assert fresh.has_row(theirs)
            np.testing.assert_array_equal(fresh.mask_row(theirs), reference.mask_row(ours))
    finally:
        workers.close()


def test_a_dead_worker_falls_back_in_process(info):
    compiled = compile_constraint(StructuredOutputsParams(regex=r"[a-z]{1,5}-[0-9]{1,5}"), info)
    start = compiled.dfa.start
    row = compiled.dfa.row(start)
    states = sorted({int(t) for t in row if t >= 0})[:2] + [start]
    workers = RowWorkers(info, 1)
    assert workers.wait_ready(60)
    workers.build(compiled, states[:1])          # starts the worker
    workers._workers[0].process.kill()
    workers._workers[0].process.wait()
    workers.build(compiled, states[1:])           # the pipe is gone: marked broken, no raise
    assert workers.broken
    for state in states:                          # the step path still builds every row
        assert compiled.mask_row(state).shape == (info.num_words,)


def test_rows_ahead_cover_the_neighbourhood_and_match(info):
    params = StructuredOutputsParams(json=ITEMS)
    reference = compile_constraint(params, info)
    compiled = _twin(reference)
    start = compiled.dfa.start
    workers = RowWorkers(info, 2)
    assert workers.wait_ready(60)
    try:
        workers.expand(compiled, [start])
        deadline = time.monotonic() + 60
        while workers.rows_ahead < RowWorkers.EXPAND_STATES and time.monotonic() < deadline:
            workers.poll()
            time.sleep(0.01)
        assert workers.rows_ahead == RowWorkers.EXPAND_STATES
        workers.expand(compiled, [start])             # asked once per state
        ahead = [s for s in range(compiled.dfa.num_states) if compiled.has_row(s)]
        assert len(ahead) == RowWorkers.EXPAND_STATES and start not in ahead
        for state in ahead:                           # the same rows as built in-process
            same = reference.dfa.state_of_set(compiled.dfa.sets[state])
            np.testing.assert_array_equal(compiled.mask_row(state), reference.mask_row(same))
    finally:
        workers.close()


def test_workers_end_with_their_pool(info):
    import gc
    compiled = compile_constraint(StructuredOutputsParams(regex=r"[a-z]{1,5}-[0-9]{1,5}"), info)
    workers = RowWorkers(info, 2)
    assert workers.wait_ready(60)
    row = compiled.dfa.row(compiled.dfa.start)
    workers.build(compiled, sorted({int(t) for t in row if t >= 0})[:2])
    processes = [w.process for w in workers._workers]
    del workers
    gc.collect()
    for process in processes:
        assert process.wait(timeout=10) is not None


def test_constraints_past_the_followed_ones_are_followed_again(info, monkeypatch):
    from tamis.constrain import row_workers
    monkeypatch.setattr(row_workers, "_KEEP", 1)
    first = compile_constraint(StructuredOutputsParams(regex=r"[a-z]{1,4}"), info)
    second = compile_constraint(StructuredOutputsParams(regex=r"[0-9]{1,4}"), info)
    workers = RowWorkers(info, 1)
    assert workers.wait_ready(60)
    try:
        for compiled in (first, second, first):   # first is dropped, then asked for again
            workers.expand(compiled, [compiled.dfa.start])
        deadline = time.monotonic() + 60
        while not first.has_row(first.dfa.row(first.dfa.start).max()) \
                and time.monotonic() < deadline:
            workers.poll()
            time.sleep(0.01)
        assert not workers.broken and workers.rows_ahead > 0
    finally:
        workers.close()


def test_nothing_waits_for_workers_that_are_starting(info):
    compiled = compile_constraint(StructuredOutputsParams(regex=r"[a-z]{1,5}-[0-9]{1,5}"), info)
    states = sorted({int(t) for t in compiled.dfa.row(compiled.dfa.start) if t >= 0})[:2]
    workers = RowWorkers(info, 1)
    try:
        started = time.monotonic()
        workers.build(compiled, states)               # the worker is still importing
        workers.expand(compiled, states)
        workers.poll()
        assert time.monotonic() - started < 0.5
        assert workers.rows_built == 0 and not any(compiled.has_row(s) for s in states)
        assert workers.wait_ready(60)
        workers.build(compiled, states)
        assert all(compiled.has_row(s) for s in states)
    finally:
        workers.close()


def test_a_large_constraint_sent_to_a_worker_busy_sending_rows(info):
    """The worker reads its pipe while it sends: a parent sending a large NFA to a worker
    whose rows built ahead fill the pipe back (nobody polling) does not deadlock."""
    import threading
    busy = compile_constraint(StructuredOutputsParams(json=ITEMS), info)
    words = [f"w{i:05d}x" for i in range(3000)]
    large = compile_constraint(StructuredOutputsParams(choice=words), info)
    workers = RowWorkers(info, 1)
    assert workers.wait_ready(60)
    states = sorted({int(t) for t in large.dfa.row(large.dfa.start) if t >= 0})[:2]
    try:
        workers.expand(busy, [busy.dfa.start])
        time.sleep(3)                                 # rows ahead pile up, unread
        done = threading.Event()
        thread = threading.Thread(target=lambda: (workers.build(large, states), done.set()),
                                  daemon=True)
        thread.start()
        assert done.wait(60), "the parent's send and the worker's send blocked each other"
        assert all(large.has_row(s) for s in states)
    finally:
        workers.close()
