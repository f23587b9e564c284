"""Mask rows of regular constraints built in worker processes, in parallel.

The first visit of a lazy-DFA state costs a token walk (``token_walk``: 1-2 ms of numpy
under the GIL). Requests of one batch often enter new states in the same step (256
requests walking a JSON schema with a 40-item array reach ~2,400 states in their first
256 tokens): built one after another on the step path, they stretch the step past the
forward pass it should hide behind. ``RowWorkers.build`` spreads the missing rows of a
step over worker processes, each holding its own tokenizer tables and its own lazy DFA of
each constraint (over the NFA, sent once), so the rows are built side by side and no
worker takes the engine's GIL.

Protocol, one pair of pipes per worker:

    parent -> worker                         worker -> parent
    ("tokenizer", token_bytes, eos, vocab)   (once, at start)
    ("nfa", key, nfa, accept)                (once per constraint and worker: a sealed NFA)
    ("rows", key, [NFA state set, ...])      [row bytes | None, ...], or "unknown" (the
                                             worker dropped ``key``: the NFA is sent again)
    ("expand", key, [NFA state set, ...])    later: ("near", key, [NFA state set, ...])
    ("ahead", key, [NFA state set, ...])     later: ("ahead", key, [(NFA state set, row
                                                    bytes), ...]), a few rows a message

"rows" is answered at once, before any queued job; "expand" and "ahead" jobs are done while
no message waits, and their answers are read whenever the parent next looks. Rows built
ahead travel in small batches: the parent reads them on the step path, where each message
costs a receive.

A state is named by its NFA state set, not by its number: each process numbers its DFA
states in its own visit order. A row that failed in a worker comes back as None and the
step path builds it itself (and gets the error there). Workers are plain subprocesses
(``python -c`` importing this module): nothing of the engine process is forked or
re-imported. They start in the background when the pool is made (a worker takes seconds
to import its modules): until they are up, rows are built in-process. A worker that dies
marks the pool broken, and every row is built in-process from then on.
"""
from __future__ import annotations

import itertools
import json
import logging
import os
import queue
import subprocess
import sys
import threading
import weakref
from collections import OrderedDict, deque
from multiprocessing.connection import Connection

import numpy as np

logger = logging.getLogger(__name__)

_KEEP = 64     # constraints a worker keeps (least recently used dropped first)
_AHEAD_BATCH = 8   # rows built ahead sent in one message
_BOOT = ("import json, os, sys; sys.path[:] = json.loads(os.environ['TAMIS_ROW_WORKER_PATH']); "
         "from tamis.constrain.row_workers import main; main()")


class _Worker:
    def __init__(self, info):
        # The child imports from exactly the parent's sys.path (not from its working
        # directory, which may hold another checkout's ``tamis``).
        env = dict(os.environ, TAMIS_ROW_WORKER_PATH=json.dumps(sys.path))
        self.process = subprocess.Popen([sys.executable, "-c", _BOOT], env=env,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.send_end = Connection(os.dup(self.process.stdin.fileno()), readable=False)
        self.recv_end = Connection(os.dup(self.process.stdout.fileno()), writable=False)
        self.process.stdin.close()
        self.process.stdout.close()
        self.known: set[int] = set()
        self.send_end.send(("tokenizer", info.token_bytes, info.eos_token_ids, info.vocab_size))

    def send(self, kind: str, compiled, key: int, states: list[int]) -> None:
        """Sends a job over ``states`` of ``compiled`` (its NFA first, if this worker lacks it)."""
        if key not in self.known:
            nfa = compiled.dfa.nfa
            self.send_end.send(("nfa", key, compiled.dfa.nfa, compiled.dfa.nfa_accept))
            self.known.add(key)
        self.send_end.send((kind, key, [tuple(compiled.dfa.sets[s]) for s in states]))

    def close(self) -> None:
        for end in (self.send_end, self.recv_end):
            end.close()
        self.process.kill()
        self.process.wait()


class _Tracked:
    """What the parent knows of one constraint's states beyond its row cache."""
    __slots__ = ("compiled", "expanded", "asked")

    def __init__(self, compiled):
        self.compiled = compiled
        self.expanded: set[int] = set()   # states whose neighbourhood was asked for
        self.asked: set[int] = set()      # states whose row a worker builds ahead


class RowWorkers:
    """``count`` worker processes, started in the background as the pool is made.

    ``build`` (on the step path) builds the rows a batch needs now. ``expand`` asks, without
    waiting, for the neighbourhood of the states requests reached: the states within
    ``EXPAND_BYTES`` bytes of each (at most ``EXPAND_STATES``, nearest first), whose rows the
    workers then build ahead, between steps; ``poll`` stores what arrived. Rows are only
    ever built for states some request reached or can reach within one token's bytes of
    one it reached, so the cache grows with the walks, not with the automaton. None of
    them waits for the workers to start: until they are up, the pool does nothing and the
    caller builds its rows itself (``wait_ready`` waits, for tests)."""

    EXPAND_BYTES = 16
    EXPAND_STATES = 48

    def __init__(self, info, count: int):
        if count < 1:
            raise ValueError(f"RowWorkers needs at least one worker, got {count}")
        self.info, self.count = info, count
        self._workers: list[_Worker] | None = None
        self._keys = itertools.count()
        self._key_by_compiled: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._tracked: dict[int, _Tracked] = {}   # key -> constraint followed, oldest first
        self._next = 0                      # round-robin of the jobs sent without a wait
        self.broken = False
        self.rows_built = 0                 # rows stored from the workers
        self.rows_ahead = 0                 # of which built ahead of need
        self._booting = threading.Thread(target=self._boot, name="tamis-row-workers-boot",
                                         daemon=True)
        self._booting.start()

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Waits for the workers to start; True once they are up (False: broken or timed out)."""
        self._booting.join(timeout)
        return self._ready() is not None

    def build(self, compiled, states: list[int]) -> None:
        """Builds the rows of ``states`` (states of ``compiled``, a ``CompiledRegex``) in
        the workers and caches them in ``compiled``. Rows a worker failed to build stay
        missing, as do all of them while the workers start: the caller's own build then
        makes them (and reports any error)."""
        workers = self._ready()
        if workers is None or not states:
            return
        try:
            key = self._key_of(compiled)
            jobs = [(w, states[i::len(workers)]) for i, w in enumerate(workers)
                    if states[i::len(workers)]]
            for worker, chunk in jobs:
                worker.send("rows", compiled, key, chunk)
            for worker, chunk in jobs:
                answer = self._answer(worker)
                if answer == "unknown":
                    worker.known.discard(key)
                    worker.send("rows", compiled, key, chunk)
                    answer = self._answer(worker)
                self._store(compiled, chunk, answer)
        except (OSError, EOFError) as exc:
            self._break(exc)

    def expand(self, compiled, states: list[int]) -> None:
        """Asks (no wait) for the neighbourhoods of ``states`` not asked for before."""
        if self._ready() is None:
            return
        tracked = self._tracked.get(self._key_of(compiled))
        fresh = [s for s in states if s not in tracked.expanded]
        if not fresh:
            return
        tracked.expanded.update(fresh)
        self._spread("expand", compiled, fresh)

    def poll(self) -> None:
        """Stores the rows built ahead and sends out the neighbourhoods that arrived."""
        workers = self._ready()
        if workers is None:
            return
        try:
            for worker in workers:
                while worker.recv_end.poll(0):
                    self._handle(worker, worker.recv_end.recv())
        except (OSError, EOFError) as exc:
            self._break(exc)

    def close(self) -> None:
        self._booting.join()
        self._stop()

    # ---- messages ------------------------------------------------------------------------

    def _answer(self, worker: _Worker):
        """The worker's answer to a "rows" job, handling what it sent before it."""
        while True:
            message = worker.recv_end.recv()
            if message == "unknown" or isinstance(message, list):
                return message
            self._handle(worker, message)

    def _handle(self, worker: _Worker, message: tuple) -> None:
        kind, key = message[0], message[1]
        tracked = self._tracked.get(key)
        if kind == "unknown":
            worker.known.discard(key)
        elif tracked is None:
            return   # a constraint no longer followed
        elif kind == "ahead":
            dfa = tracked.compiled.dfa
            for nfa_set, data in message[2]:
                state = dfa.state_of_set(tuple(nfa_set))
                self.rows_ahead += self._store_row(tracked.compiled, state, data)
        elif kind == "near":
            compiled = tracked.compiled
            wanted = []
            for nfa_set in message[2]:
                state = compiled.dfa.state_of_set(tuple(nfa_set))
                if state not in tracked.asked and not compiled.has_row(state):
                    tracked.asked.add(state)
                    wanted.append(state)
            if wanted:
                self._spread("ahead", compiled, wanted)

    def _spread(self, kind: str, compiled, states: list[int]) -> None:
        """Deals ``states`` round the workers, one message each (jobs without an answer
        awaited)."""
        try:
            workers = self._workers
            key = self._key_of(compiled)
            first = self._next
            self._next += len(states)
            for i, worker in enumerate(workers):
                share = states[(i - first) % len(workers)::len(workers)]
                if share:
                    worker.send(kind, compiled, key, share)
        except (OSError, EOFError) as exc:
            self._break(exc)

    def _store(self, compiled, states: list[int], answer: list) -> None:
        for state, data in zip(states, answer):
            self._store_row(compiled, state, data)

    def _store_row(self, compiled, state: int, data: bytes | None) -> bool:
        """Caches a row a worker built (None: it failed); True if the row was new."""
        if data is None or compiled.has_row(state):
            return False
        compiled.store_row(state, np.frombuffer(data, dtype=np.int32))
        self.rows_built += 1
        return True

    def _key_of(self, compiled) -> int:
        """This pool's key for ``compiled`` (its workers know the NFA by it); a constraint
        dropped from those followed (the oldest beyond ``_KEEP``) is followed again."""
        key = self._key_by_compiled.get(compiled)
        if key is None:
            key = self._key_by_compiled[compiled] = next(self._keys)
        if key not in self._tracked:
            self._tracked[key] = _Tracked(compiled)
            while len(self._tracked) > _KEEP:
                self._tracked.pop(next(iter(self._tracked)))
        return key

    # ---- start and stop ------------------------------------------------------------------

    def _boot(self) -> None:
        """Starts the processes (the background thread's work): each blocks this thread
        until its child, done importing, reads the tokenizer tables."""
        workers = []
        try:
            for _ in range(self.count):
                workers.append(_Worker(self.info))
        except (OSError, EOFError) as exc:
            _close_all(workers)
            self._break(exc)
            return
        # Processes end with their pool, even one nobody closed (an engine dropped).
        self._finalizer = weakref.finalize(self, _close_all, workers)
        self._workers = workers

    def _ready(self) -> list[_Worker] | None:
        """The workers, once started and while not broken; None otherwise (no wait)."""
        if self.broken or self._booting.is_alive():
            return None
        return self._workers

    def _break(self, exc: Exception) -> None:
        logger.warning("mask row workers stopped (%s): rows are built in-process from now on", exc)
        self.broken = True
        self._stop()

    def _stop(self) -> None:
        """Ends the worker processes, if they were started."""
        if self._workers is not None:
            self._finalizer()
        self._workers = None


def _close_all(workers: list[_Worker]) -> None:
    for worker in workers:
        try:
            worker.close()
        except OSError:
            pass


# ---- the worker side --------------------------------------------------------------------------

class _Serving:
    """A worker's state: the tokenizer, the constraints' DFAs, jobs without an answer awaited."""

    def __init__(self):
        from .compiled import mask_row_of
        self.mask_row_of = mask_row_of
        self.info = self.eos_row = None
        self.dfas: OrderedDict = OrderedDict()
        self.near: deque = deque()       # (key, NFA set): neighbourhoods to send
        self.ahead: deque = deque()      # (key, NFA set): rows to build ahead
        self.built: dict = {}            # key -> [(NFA set, row bytes)] built ahead, unsent

    def handle(self, message: tuple, send_end: Connection) -> None:
        kind = message[0]
        if kind == "tokenizer":
            self._tokenizer(*message[1:])
        elif kind == "nfa":
            self._nfa(*message[1:])
        elif kind == "rows":
            _, key, sets = message
            dfa = self.dfas.get(key)
            if dfa is None:
                send_end.send("unknown")
                return
            self.dfas.move_to_end(key)
            send_end.send([self._row_bytes(dfa, nfa_set) for nfa_set in sets])
        else:   # "expand" / "ahead": queued, done while no other message waits
            queue = self.near if kind == "expand" else self.ahead
            queue.extend((message[1], nfa_set) for nfa_set in message[2])

    def background_step(self, send_end: Connection) -> None:
        """One queued job: a neighbourhood first (it feeds the rows ahead), else a row,
        kept back until ``_AHEAD_BATCH`` of them can go in one message (``flush``)."""
        queue = self.near if self.near else self.ahead
        key, nfa_set = queue.popleft()
        dfa = self.dfas.get(key)
        if dfa is None:
            send_end.send(("unknown", key))
        elif queue is self.near:
            send_end.send(("near", key, _neighbourhood(dfa, dfa.state_of_set(tuple(nfa_set)))))
        else:
            self.built.setdefault(key, []).append((nfa_set, self._row_bytes(dfa, nfa_set)))
            if len(self.built[key]) >= _AHEAD_BATCH:
                send_end.send(("ahead", key, self.built.pop(key)))

    def flush(self, send_end: Connection) -> None:
        """Sends the rows built ahead and not sent yet."""
        for key, rows in self.built.items():
            send_end.send(("ahead", key, rows))
        self.built.clear()

    def has_background_work(self) -> bool:
        return bool(self.near or self.ahead)

    def _tokenizer(self, token_bytes, eos_token_ids, vocab_size) -> None:
        from .token_masks import pack_bits
        from .tokenizer_info import TokenizerInfo
        self.info = TokenizerInfo(token_bytes, tuple(eos_token_ids), vocab_size)
        eos = np.zeros(vocab_size, dtype=bool)
        eos[list(self.info.eos_token_ids)] = True
        self.eos_row = pack_bits(eos, self.info.num_words)

    def _nfa(self, key, nfa, accept) -> None:
        from .automaton import LazyDFA
        self.dfas[key] = LazyDFA.from_nfa(nfa, accept)
        while len(self.dfas) > _KEEP:
            self.dfas.popitem(last=False)

    def _row_bytes(self, dfa, nfa_set) -> bytes | None:
        try:
            state = dfa.state_of_set(tuple(nfa_set))
            return self.mask_row_of(self.info, dfa, state, self.eos_row).tobytes()
        except Exception:   # the parent builds this row itself and reports the error
            return None


def _neighbourhood(dfa, state: int) -> list[tuple]:
    """NFA sets of the states within ``EXPAND_BYTES`` bytes of ``state``, nearest first, at
    most ``EXPAND_STATES``."""
    seen, frontier, out = {state}, [state], []
    for _ in range(RowWorkers.EXPAND_BYTES):
        following = []
        for q in frontier:
            for target in np.unique(dfa.row(q)).tolist():
                if target >= 0 and target not in seen:
                    seen.add(target)
                    following.append(target)
                    out.append(tuple(dfa.sets[target]))
                    if len(out) >= RowWorkers.EXPAND_STATES:
                        return out
        frontier = following
    return out


def serve(recv_end: Connection, send_end: Connection) -> None:
    """Answers the parent's messages (module docstring) until its pipe closes; between
    messages, works through the jobs that need no prompt answer. A thread reads the pipe
    as messages come, so the parent's sends never wait on a worker busy sending (both
    sides blocked on full pipes would deadlock)."""
    inbox: queue.SimpleQueue = queue.SimpleQueue()
    threading.Thread(target=_read_into, args=(recv_end, inbox), daemon=True).start()
    serving = _Serving()
    while True:
        try:
            if serving.has_background_work() and inbox.empty():
                serving.background_step(send_end)
                continue
            serving.flush(send_end)
            message = inbox.get()
            if message is None:
                return
            serving.handle(message, send_end)
        except (EOFError, OSError):
            return


def _read_into(recv_end: Connection, inbox: queue.SimpleQueue) -> None:
    """Moves the parent's messages into ``inbox``; None once the pipe closes."""
    try:
        while True:
            inbox.put(recv_end.recv())
    except (EOFError, OSError):
        inbox.put(None)


def main() -> None:
    """The worker process's entry point (``_BOOT``)."""
    # The pipes are the protocol's; stray prints of imported code go to stderr instead.
    recv_end = Connection(os.dup(0), writable=False)
    send_end = Connection(os.dup(1), readable=False)
    os.dup2(2, 1)
    serve(recv_end, send_end)


if __name__ == "__main__":
    main()
