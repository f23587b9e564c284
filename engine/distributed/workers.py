"""The processes of ranks 1..N-1 of a multi-process engine and what rank 0 tells them.

Rank 0 is the engine's own process: it hosts the scheduler, the KV block manager,
structured outputs and sampling, and drives the other ranks::

    rank 0                                   rank r (worker_main)
    WorkerPool.start  -- spawn ------------>  join the groups, load the model shard
                      <-- ("ready",) -------
    send(("init_kv", sizes))  ------------->  size the KV cache; min over ranks (collective)
    send(("step", StepMessage))  ---------->  same inputs, same forward (collectives)
    sample on the gathered logits             (logits dropped)
    idle: send(("ping",))  ---------------->  one empty collective (ranks it did not start)
    close: send(("shutdown",))  ----------->  exit

Commands travel over one pipe per worker, or across hosts (and under torchrun, which
starts every rank itself: ``torchrun.py``) through the rendezvous store (``channels.py``);
tensors travel only through torch.distributed. A worker whose channel closes (rank 0 is
gone) exits. A rank that dies fails every peer's next collective at once ("connection
closed by peer"); one that hangs fails it after ``collective_timeout_s()``. Rank 0 then
raises ``RankFailedError`` naming the rank and how it ended. An idle rank 0 learns that
a rank process of its host died from ``WorkerPool.sentinels``, and that any other rank
did from ``WorkerPool.ping``.
"""
from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import os
import time
import traceback
from dataclasses import dataclass, field
from typing import Callable, Iterator, NoReturn

import torch

from tamis.engine.distributed.channels import PipeEnd, PipeLinks, StoreEnd, StoreLinks
from tamis.engine.distributed.parallel_state import (SINGLE, SINGLE_STAGE, connect_store,
                                                     make_groups)
from tamis.engine.distributed.torchrun import TorchrunRank

LOOPBACK = "127.0.0.1"
_POLL_S = 0.05


# Start-up (spawn, rendezvous, loading a shard) may take long for a big checkpoint; a rank
# that dies meanwhile is noticed at once (its process is polled), one that hangs by this.
STARTUP_TIMEOUT_S = 1800.0


def collective_timeout_s() -> float:
    """Seconds a collective may wait for a silent (hung) rank before failing;
    ``TAMIS_DISTRIBUTED_TIMEOUT_S``, default 600. A rank that exits fails it at once."""
    return float(os.environ.get("TAMIS_DISTRIBUTED_TIMEOUT_S", "600"))


class RankFailedError(RuntimeError):
    """A rank of a multi-process engine failed or exited; the engine cannot go on."""


@dataclass
class ScheduledChunk:
    """What a rank needs of one scheduled request to build the step's inputs (the fields
    of ``ScheduledRequest`` that ``ModelRunner.prepare_inputs`` reads)."""
    token_ids: list[int]
    start: int
    num_new_tokens: int
    block_ids: list[int]
    samples: bool
    num_prompt_logprob_rows: int
    group_block_ids: list[list[int]] = field(default_factory=list)   # KV-cache groups 1..


@dataclass
class StepMessage:
    """One step's inputs for the other ranks. With ``has_inflight`` some input ids are
    on rank 0's device only: the ranks then receive ``input_ids`` by broadcast."""
    scheduled: list[ScheduledChunk] = field(default_factory=list)
    has_inflight: bool = False

    @classmethod
    def of(cls, batch, has_inflight: bool) -> "StepMessage":
        return cls([ScheduledChunk(item.token_ids, item.start, item.num_new_tokens,
                                   list(item.block_ids), bool(item.samples),
                                   item.num_prompt_logprob_rows,
                                   [list(table) for table in item.group_block_ids])
                    for item in batch.scheduled], has_inflight)


def rank_device(device: torch.device, local_rank: int) -> torch.device:
    """The device of the host's ``local_rank``-th rank: that GPU on CUDA, else the CPU."""
    return torch.device("cuda", local_rank) if device.type == "cuda" else device


def ranks_per_node(config) -> int:
    return config.world_size // config.nnodes


# ----------------------------------------------------------------------- worker side

def worker_main(config, rank: int, store_address: tuple[str, int], device_type: str,
                conn=None) -> None:
    """Entry point of rank ``rank``'s process when a tamis process spawned it: on rank 0's
    host ``conn`` is its pipe, on another host (``conn`` None) it talks through the store
    at ``store_address``."""
    def connect():
        return connect_store(*store_address, config.world_size, False, STARTUP_TIMEOUT_S)

    run_rank(config, rank, rank % ranks_per_node(config), connect, device_type,
             PipeEnd(conn) if conn is not None else None)


def run_rank(config, rank: int, local_rank: int, connect: Callable[[], object],
             device_type: str, end=None) -> NoReturn:
    """Runs rank ``rank`` (the ``local_rank``-th of its host) until rank 0 stops it, then
    exits the process: 0 when stopped or rank 0 is gone, 1 when this rank failed.
    ``connect()`` returns the rendezvous store; ``end`` is the rank's pipe to rank 0, or
    None to take commands from the store."""
    try:
        device = rank_device(torch.device(device_type), local_rank)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        else:   # the ranks share the host's cores
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // ranks_per_node(config)))
        store = connect()
        end = end or StoreEnd(store, rank)
        end.report(("joining",))
        tp, pp = make_groups(store, rank, config.tensor_parallel_size,
                             config.pipeline_parallel_size, device, collective_timeout_s())
        from tamis.engine.distributed.runner import ShardRunner
        runner = ShardRunner(config, device, tp, pp)
        end.report(("ready",))
        _serve(runner, end)
    except BaseException:   # report, then exit non-zero: rank 0 names this rank's error
        if end is not None:
            with contextlib.suppress(OSError, RuntimeError):
                end.report(("error", traceback.format_exc()))
        traceback.print_exc()
        os._exit(1)
    # Skip interpreter teardown: destroying a process group whose peers are gone aborts
    # the process from C++ ("terminate called without an active exception").
    os._exit(0)


def _serve(runner, end) -> None:
    while True:
        try:
            kind, *args = end.receive()
        except EOFError:   # rank 0 is gone
            return
        if kind == "shutdown":
            return
        if kind == "init_kv":
            runner.initialize_kv_cache(*args)
        elif kind == "step":
            runner.run_step(args[0])
        elif kind == "ping":   # rank 0 idles and checks that every rank still answers
            runner.pp.world.min_over_ranks(0)
        else:
            raise ValueError(f"unknown command {kind!r} from rank 0")


def spawn_ranks(config, ranks: range, store_address: tuple[str, int], device_type: str,
                with_pipes: bool) -> tuple[dict, dict]:
    """Starts ``ranks`` on this host: ({rank: process}, {rank: rank 0's pipe end})."""
    context = multiprocessing.get_context("spawn")
    processes, conns = {}, {}
    with _children_allowed():
        for rank in ranks:
            ours, theirs = context.Pipe() if with_pipes else (None, None)
            process = context.Process(target=worker_main, name=f"tamis-rank{rank}",
                                      args=(config, rank, store_address, device_type, theirs),
                                      daemon=True)
            process.start()
            if theirs is not None:
                theirs.close()
                conns[rank] = ours
            processes[rank] = process
    return processes, conns


# ----------------------------------------------------------------------- rank 0's side

@contextlib.contextmanager
def _children_allowed() -> Iterator[None]:
    """Lets a daemonic process (``tamis serve``'s engine core) start its rank processes.

    multiprocessing refuses children of daemonic processes only so that they are not
    orphaned; ranks cannot be: each exits when its pipe or store to rank 0 closes."""
    config = multiprocessing.current_process()._config
    daemonic = config.get("daemon", False)
    config["daemon"] = False
    try:
        yield
    finally:
        config["daemon"] = daemonic


class WorkerPool:
    """Ranks 1..N-1 of one engine (the caller is rank 0): processes of its host, and
    with ``--nnodes`` > 1 the ranks other hosts start (``tamis.engine.distributed.node``)."""

    def __init__(self, processes: dict, links, ranks: range) -> None:
        self.processes, self.links, self.ranks = processes, links, ranks
        self.tp, self.pp = SINGLE, SINGLE_STAGE   # rank 0's groups, once joined
        self._store = None
        self._closed = False

    @classmethod
    def start(cls, config, device: torch.device) -> "WorkerPool":
        """Starts this host's other ranks (none under torchrun, which started them) and
        joins the groups with every rank (rank 0's groups in ``.tp``, ``.pp``)."""
        launch = TorchrunRank.from_environ()
        if launch is not None:
            pool = cls._of_torchrun(config, launch)
        else:
            pool = cls._spawned(config, device)
        try:
            pool._expect("joining", STARTUP_TIMEOUT_S)
            pool.tp, pool.pp = make_groups(pool._store, 0, config.tensor_parallel_size,
                                           config.pipeline_parallel_size, device,
                                           collective_timeout_s())
        except BaseException:
            pool.close()
            raise
        return pool

    @classmethod
    def _spawned(cls, config, device: torch.device) -> "WorkerPool":
        """Serves the store; spawns ranks 1.. of this host, the others join from theirs."""
        size, local = config.world_size, ranks_per_node(config)
        single_host = config.nnodes == 1
        host, port = (LOOPBACK, 0) if single_host else (config.master_addr, config.master_port)
        store = connect_store(host, port, size, True, STARTUP_TIMEOUT_S)
        processes, conns = spawn_ranks(config, range(1, local), (host, store.port),
                                       device.type, with_pipes=single_host)
        links = PipeLinks(conns) if single_host else StoreLinks(store, range(1, size))
        pool = cls(processes, links, range(1, size))
        pool._store = store
        return pool

    @classmethod
    def _of_torchrun(cls, config, launch: TorchrunRank) -> "WorkerPool":
        """Every other rank is a process torchrun started: they join through its store.
        Their failures reach rank 0 as error reports and failed collectives, and torchrun
        stops every rank when one exits with an error."""
        if launch.rank != 0:
            raise ValueError(f"torchrun's rank {launch.rank} cannot run the engine (rank 0 "
                             f"does): run python -m tamis.engine.distributed.node under "
                             f"torchrun")
        launch.check(config)
        store = launch.connect_store(STARTUP_TIMEOUT_S)
        pool = cls({}, StoreLinks(store, range(1, config.world_size)),
                   range(1, config.world_size))
        pool._store = store
        return pool

    def wait_ready(self) -> None:
        """Returns once every rank loaded its shard; RankFailedError if one failed."""
        self._expect("ready", STARTUP_TIMEOUT_S)

    def _expect(self, reply: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for rank in self.ranks:
            while (message := self.links.poll_report(rank)) is None:
                process = self.processes.get(rank)
                if process is not None and not process.is_alive():
                    raise self.failure()
                if time.monotonic() > deadline:
                    raise RankFailedError(f"rank {rank} sent no {reply!r} within "
                                          f"{timeout_s:.0f} s")
                time.sleep(_POLL_S)
            if message[0] != reply:
                raise self.failure(reports={rank: message[1]})

    @property
    def sentinels(self) -> list[int]:
        """One handle per rank process of this host, ready once that process has ended
        (for ``multiprocessing.connection.wait``); ranks of other hosts have none."""
        return [process.sentinel for process in self.processes.values()]

    def check_alive(self) -> None:
        """RankFailedError naming the rank if a rank process of this host has ended."""
        # The sentinel, not is_alive(): a process may end a moment before it can be reaped.
        if multiprocessing.connection.wait(self.sentinels, timeout=0):
            raise self.failure()

    @property
    def has_remote_ranks(self) -> bool:
        """Whether some ranks are not this process's children (another host's, torchrun's)."""
        return len(self.processes) < len(self.ranks)

    def ping(self) -> None:
        """One collective with every rank: RankFailedError if one has exited (at once) or
        hangs (after ``collective_timeout_s()``). Only a collective sees the end of a rank
        that is not this process's child."""
        self.send(("ping",))
        with self.watch():
            self.pp.world.min_over_ranks(0)

    def send(self, command: tuple) -> None:
        """Sends ``command`` to every rank; RankFailedError if one is gone."""
        try:
            self.links.broadcast(command)
        except (OSError, RuntimeError) as exc:
            raise self.failure(exc) from exc

    @contextlib.contextmanager
    def watch(self) -> Iterator[None]:
        """Turns a failed collective into a RankFailedError naming the rank that failed."""
        try:
            yield
        except RuntimeError as exc:
            if isinstance(exc, RankFailedError):
                raise
            raise self.failure(exc) from exc

    def failure(self, cause: BaseException | None = None,
                reports: dict[int, str] | None = None) -> RankFailedError:
        """What went wrong, read from the ranks' error reports and exit codes; the pool
        is closed (the surviving ranks are stopped)."""
        time.sleep(0.2)   # let a dying rank's exit code and report land
        reasons = []
        for rank in self.ranks:
            report = (reports or {}).get(rank) or self.links.error_report(rank)
            process = self.processes.get(rank)
            if report:
                reasons.append(f"rank {rank} failed:\n{report}")
            elif process is not None and process.exitcode is not None:
                reasons.append(f"rank {rank} (pid {process.pid}) exited with "
                               f"{_describe_exit(process.exitcode)}")
        self.close(timeout_s=1.0)   # a hung rank would not answer a longer wait either
        if not reasons:
            reasons.append(f"a collective failed: {cause}")
        return RankFailedError("engine stopped: " + "; ".join(reasons))

    def close(self, timeout_s: float = 5.0) -> None:
        """Stops every rank (asks, then terminates those of this host still running).
        Idempotent."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(OSError, RuntimeError):
            self.links.broadcast(("shutdown",))
        deadline = time.monotonic() + timeout_s
        for process in self.processes.values():
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                process.terminate()
                process.join(timeout_s)
            if process.is_alive():   # stopped (SIGSTOP) or ignoring SIGTERM
                process.kill()
                process.join(timeout_s)
        self.links.close()


def _describe_exit(code: int) -> str:
    if code >= 0:
        return f"exit code {code}"
    import signal
    with contextlib.suppress(ValueError):
        return f"signal {signal.Signals(-code).name}"
    return f"signal {-code}"


__all__ = ["WorkerPool", "StepMessage", "RankFailedError", "worker_main",
           "collective_timeout_s"]
