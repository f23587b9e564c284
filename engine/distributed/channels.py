"""How rank 0 tells the other ranks what to run, and how they answer it.

On one host each rank has a pipe to rank 0 (``multiprocessing`` connections). Across
hosts, messages go through the rendezvous store (the ``torch.distributed.TCPStore`` at
``--master-addr:--master-port``): command i under key ``cmd/i``, a rank's reports under
``report/<rank>/<kind>``. Either way they are small pickled tuples; tensors go through
torch.distributed only.

    commands (rank 0 -> all):  ("init_kv", sizes...), ("step", StepMessage), ("shutdown",)
    reports (rank -> rank 0):  ("joining",), ("ready",), ("error", traceback text)

A rank's ``receive`` raises EOFError once rank 0 is gone (its pipe or its store closed).
"""
from __future__ import annotations

import contextlib
import datetime
import pickle

# An idle rank re-arms its wait for the next command this often (the store's own
# timeout would otherwise end a wait that is only an idle server).
_IDLE_WAIT = datetime.timedelta(seconds=60)
# Commands are deleted from the store two behind: every rank has read them by then,
# since each command but the last ends in a collective all ranks join.
_KEEP_COMMANDS = 2


class PipeEnd:
    """A rank's end of its pipe to rank 0."""

    def __init__(self, conn) -> None:
        self.conn = conn

    def report(self, message: tuple) -> None:
        self.conn.send(message)

    def receive(self) -> tuple:
        return self.conn.recv()


class StoreEnd:
    """A rank's end of the store channel (ranks on another host than rank 0)."""

    def __init__(self, store, rank: int) -> None:
        self.store, self.rank, self.seq = store, rank, 0

    def report(self, message: tuple) -> None:
        self.store.set(f"report/{self.rank}/{message[0]}", pickle.dumps(message))

    def receive(self) -> tuple:
        key = f"cmd/{self.seq}"
        while True:
            try:
                self.store.wait([key], _IDLE_WAIT)
                break
            except RuntimeError as exc:   # DistStoreError: a timeout, or the store is gone
                if "timeout" not in str(exc).lower():
                    raise EOFError(f"rank 0's store is unreachable: {exc}") from exc
        self.seq += 1
        return pickle.loads(self.store.get(key))


class PipeLinks:
    """Rank 0's pipes to the ranks of its host (``conns[rank]``)."""

    def __init__(self, conns: dict) -> None:
        self.conns = conns

    def broadcast(self, command: tuple) -> None:
        for conn in self.conns.values():
            conn.send(command)

    def poll_report(self, rank: int) -> tuple | None:
        conn = self.conns[rank]
        return conn.recv() if conn.poll(0) else None

    def error_report(self, rank: int) -> str | None:
        with contextlib.suppress(OSError, EOFError):
            while (message := self.poll_report(rank)) is not None:
                if message[0] == "error":
                    return message[1]
        return None

    def close(self) -> None:
        for conn in self.conns.values():
            conn.close()


class StoreLinks:
    """Rank 0's store channel to every other rank (several hosts)."""

    def __init__(self, store, ranks: range) -> None:
        self.store, self.ranks, self.seq = store, ranks, 0
        self._seen: dict[int, set[str]] = {rank: set() for rank in ranks}

    def broadcast(self, command: tuple) -> None:
        self.store.set(f"cmd/{self.seq}", pickle.dumps(command))
        if self.seq >= _KEEP_COMMANDS:
            with contextlib.suppress(RuntimeError):
                self.store.delete_key(f"cmd/{self.seq - _KEEP_COMMANDS}")
        self.seq += 1

    def poll_report(self, rank: int) -> tuple | None:
        """The rank's error report if any, else its next report not yet returned."""
        for kind in ("error", "joining", "ready"):
            key = f"report/{rank}/{kind}"
            if kind not in self._seen[rank] and self.store.check([key]):
                self._seen[rank].add(kind)
                return pickle.loads(self.store.get(key))
        return None

    def error_report(self, rank: int) -> str | None:
        with contextlib.suppress(RuntimeError):
            key = f"report/{rank}/error"
            if self.store.check([key]):
                return pickle.loads(self.store.get(key))[1]
        return None

    def close(self) -> None:
        pass
