"""The tensor-parallel group of one engine: its rank, its size and its collectives.

A model is built inside ``tensor_parallel(group)``; each parallel layer keeps the group
it was built under (``current_tp_group()``), so two engines in one process share no
state, and a model built outside the context is a one-rank model whose layers do no
collective at all (the single-process path is the same code it was).

Two process groups per engine: ``device_group`` carries the model's tensors (NCCL on
CUDA, gloo on CPU); ``cpu_group`` (gloo) carries host values such as the KV block count.
They are made from a store (``torch.distributed.TCPStore``), not through
``init_process_group``: the engine's process owns no global default group, so a test
process may start and stop several engines.
"""
from __future__ import annotations

import contextlib
import datetime
from dataclasses import dataclass
from typing import Any, Iterator

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class TPGroup:
    """Rank ``rank`` of ``size``; with ``size == 1`` every collective returns its input."""
    rank: int = 0
    size: int = 1
    device_group: Any = None
    cpu_group: Any = None

    @property
    def is_parallel(self) -> bool:
        return self.size > 1

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The elementwise sum over ranks (in place on a contiguous ``x``)."""
        if self.size == 1:
            return x
        x = x.contiguous()
        self.device_group.allreduce([x]).wait()
        return x

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Every rank's ``x`` concatenated along ``dim``, rank 0 first."""
        if self.size == 1:
            return x
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(self.size)]
        self.device_group.allgather([parts], [x]).wait()
        return torch.cat(parts, dim=dim)

    def broadcast(self, x: torch.Tensor, src: int = 0) -> torch.Tensor:
        """Rank ``src``'s ``x`` written into every rank's ``x`` (same shape and dtype)."""
        if self.size > 1:
            options = dist.BroadcastOptions()
            options.rootRank = src
            self.device_group.broadcast([x], options).wait()
        return x

    def min_over_ranks(self, value: int) -> int:
        """The smallest of the ranks' ``value`` (host integers, over the CPU group)."""
        if self.size == 1:
            return value
        tensor = torch.tensor([value], dtype=torch.int64)
        options = dist.AllreduceOptions()
        options.reduceOp = dist.ReduceOp.MIN
        self.cpu_group.allreduce([tensor], options).wait()
        return int(tensor.item())


SINGLE = TPGroup()
_building: TPGroup | None = None


@contextlib.contextmanager
def tensor_parallel(group: TPGroup) -> Iterator[TPGroup]:
    """Layers built inside take ``group``. Nesting is a bug and raises."""
    global _building
    if _building is not None:
        raise RuntimeError("tensor_parallel() contexts cannot be nested")
    _building = group
    try:
        yield group
    finally:
        _building = None


def current_tp_group() -> TPGroup:
    """The group of the model being built; the one-rank group outside ``tensor_parallel``."""
    return _building or SINGLE


def connect_store(host: str, port: int, world_size: int, is_master: bool,
                  timeout_s: float) -> dist.TCPStore:
    """The rendezvous store (the master binds ``port``; 0 picks a free one)."""
    return dist.TCPStore(host, port, world_size, is_master=is_master,
                         timeout=datetime.timedelta(seconds=timeout_s),
                         wait_for_workers=False)


def make_tp_group(store: dist.Store, rank: int, size: int, device: torch.device,
                  timeout_s: float) -> TPGroup:
    """Rank ``rank``'s groups; every rank must call it (it waits for all of them).

    ``timeout_s`` bounds each collective: a rank that stops answering ends its peers'
    waits with a RuntimeError after that long (a rank that exits ends them at once)."""
    timeout = datetime.timedelta(seconds=timeout_s)
    cpu_group = dist.ProcessGroupGloo(dist.PrefixStore("cpu", store), rank, size, timeout)
    if device.type == "cuda":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        device_group = dist.ProcessGroupNCCL(dist.PrefixStore("device", store), rank, size,
                                             options)
    else:
        device_group = dist.ProcessGroupGloo(dist.PrefixStore("device", store), rank, size,
                                             timeout)
    return TPGroup(rank, size, device_group, cpu_group)
