"""Mask rows of regular constraints built in worker processes, in parallel.

The first visit of a lazy-DFA state costs a token walk (``token_walk``: 1-2 ms of numpy
under the GIL). Requests of one batch often enter new states in the same step (256
requests walking a JSON schema with a 40-item array reach ~2,400 states in their first
256 tokens): built one after another on the step path, they stretch the step past the
forward pass it should hide behind. ``RowWorkers.build`` spreads the missing rows of a
step over worker processes, each holding its own tokenizer tables and its own lazy DFA of
each constraint (over the NFA, sent once), so the rows are built side by side and no
worker takes the engine's GIL.

Protocol, one pair of pipes per worker; the parent sends, then reads the answers in order:

    ("tokenizer", token_bytes, eos_token_ids, vocab_size)   once, at start
    ("nfa", key, edges, eps, accept)                         once per constraint and worker
    ("rows", key, [NFA state set, ...])  -> [row bytes | None, ...]
                                         or "unknown" (the worker dropped ``key``: the NFA
                                         is sent again)

A state is named by its NFA state set, not by its number: each process numbers its DFA
states in its own visit order. A row that failed in a worker comes back as None and the
step path builds it itself (and gets the error there). Workers are plain subprocesses
(``python -m tamis.constrain.row_workers``): nothing of the engine process is forked or
re-imported. A worker that dies marks the pool broken, and every row is built in-process
from then on.
"""
from __future__ import annotations

import itertools
import logging
import os
import subprocess
import sys
from collections import OrderedDict
from multiprocessing.connection import Connection

import numpy as np

logger = logging.getLogger(__name__)

_KEEP = 64     # constraints a worker keeps (least recently used dropped first)


class _Worker:
    def __init__(self, info):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        self.process = subprocess.Popen(
            [sys.executable, "-P", "-m", "tamis.constrain.row_workers"], env=env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.send_end = Connection(os.dup(self.process.stdin.fileno()), readable=False)
        self.recv_end = Connection(os.dup(self.process.stdout.fileno()), writable=False)
        self.process.stdin.close()
        self.process.stdout.close()
        self.known: set[int] = set()
        self.send_end.send(("tokenizer", info.token_bytes, info.eos_token_ids, info.vocab_size))

    def ask_rows(self, compiled, key: int, states: list[int]) -> None:
        if key not in self.known:
            nfa = compiled.dfa.nfa
            self.send_end.send(("nfa", key, nfa.edges, nfa.eps, compiled.dfa.nfa_accept))
            self.known.add(key)
        sets = [tuple(compiled.dfa.sets[s]) for s in states]
        self.send_end.send(("rows", key, sets))

    def close(self) -> None:
        for end in (self.send_end, self.recv_end):
            end.close()
        self.process.kill()
        self.process.wait()


class RowWorkers:
    """``count`` worker processes, started on first use."""

    def __init__(self, info, count: int):
        if count < 1:
            raise ValueError(f"RowWorkers needs at least one worker, got {count}")
        self.info, self.count = info, count
        self._workers: list[_Worker] | None = None
        self._keys = itertools.count()
        self.broken = False
        self.rows_built = 0

    def build(self, compiled, states: list[int]) -> None:
        """Builds the rows of ``states`` (states of ``compiled``, a ``CompiledRegex``) in
        the workers and caches them in ``compiled``. Rows a worker failed to build stay
        missing: the caller's own build reports the error."""
        if self.broken or not states:
            return
        try:
            workers = self._start()
            key = _key_of(compiled, self._keys)
            jobs = [(w, states[i::len(workers)]) for i, w in enumerate(workers)
                    if states[i::len(workers)]]
            for worker, chunk in jobs:
                worker.ask_rows(compiled, key, chunk)
            for worker, chunk in jobs:
                answer = worker.recv_end.recv()
                if answer == "unknown":
                    worker.known.discard(key)
                    worker.ask_rows(compiled, key, chunk)
                    answer = worker.recv_end.recv()
                self._store(compiled, chunk, answer)
        except (OSError, EOFError) as exc:
            logger.warning("mask row workers stopped (%s): rows are built in-process from now on",
                           exc)
            self.broken = True
            self.close()

    def _store(self, compiled, states: list[int], answer: list) -> None:
        for state, data in zip(states, answer):
            if data is not None:
                compiled.store_row(state, np.frombuffer(data, dtype=np.int32))
                self.rows_built += 1

    def _start(self) -> list[_Worker]:
        if self._workers is None:
            self._workers = [_Worker(self.info) for _ in range(self.count)]
        return self._workers

    def close(self) -> None:
        for worker in self._workers or ():
            try:
                worker.close()
            except OSError:
                pass
        self._workers = None


def _key_of(compiled, keys) -> int:
    key = getattr(compiled, "_row_worker_key", None)
    if key is None:
        key = compiled._row_worker_key = next(keys)
    return key


# ---- the worker side --------------------------------------------------------------------------

def serve(recv_end: Connection, send_end: Connection) -> None:
    """Answers the parent's messages (module docstring) until its pipe closes."""
    from .automaton import NFA, LazyDFA
    from .compiled import mask_row_of
    from .token_masks import pack_bits
    from .tokenizer_info import TokenizerInfo

    info = eos_row = None
    dfas: OrderedDict[int, LazyDFA] = OrderedDict()
    while True:
        try:
            message = recv_end.recv()
        except EOFError:
            return
        if message[0] == "tokenizer":
            _, token_bytes, eos_token_ids, vocab_size = message
            info = TokenizerInfo(token_bytes, tuple(eos_token_ids), vocab_size)
            eos = np.zeros(vocab_size, dtype=bool)
            eos[list(info.eos_token_ids)] = True
            eos_row = pack_bits(eos, info.num_words)
        elif message[0] == "nfa":
            _, key, edges, eps, accept = message
            nfa = NFA()
            nfa.edges, nfa.eps = edges, eps
            dfas[key] = LazyDFA.from_nfa(nfa, accept)
            while len(dfas) > _KEEP:
                dfas.popitem(last=False)
        else:
            _, key, sets = message
            dfa = dfas.get(key)
            if dfa is None:
                send_end.send("unknown")
                continue
            dfas.move_to_end(key)
            send_end.send([_row_bytes(info, dfa, nfa_set, eos_row, mask_row_of) for nfa_set in sets])


def _row_bytes(info, dfa, nfa_set, eos_row, mask_row_of) -> bytes | None:
    try:
        state = dfa.state_of_set(frozenset(nfa_set))
        return mask_row_of(info, dfa, state, eos_row).tobytes()
    except Exception:   # the parent builds this row itself and reports the error
        return None


def _main() -> None:
    # The pipes are the protocol's; stray prints of imported code go to stderr instead.
    recv_end = Connection(os.dup(0), writable=False)
    send_end = Connection(os.dup(1), readable=False)
    os.dup2(2, 1)
    serve(recv_end, send_end)


if __name__ == "__main__":
    _main()
