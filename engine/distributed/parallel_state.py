"""The parallel groups of one engine rank: its tensor-parallel group and pipeline stage.

A model is built inside ``model_parallel(tp, pp)``; each parallel layer keeps the group
it was built under (``current_tp_group()``), the model its stage (``current_pp_group()``),
so two engines in one process share no state, and a model built outside the context is a
one-rank model whose layers do no collective at all (the single-process path is the same
code it was).

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


@dataclass(frozen=True)
class PPGroup:
    """Pipeline stage ``stage`` of ``num_stages``, each stage a tensor-parallel group of
    ``tp_size`` ranks; global rank = ``stage * tp_size + tp_rank``. ``world`` spans every
    rank: stages send their activations through its device group."""
    stage: int = 0
    num_stages: int = 1
    tp_size: int = 1
    world: TPGroup = SINGLE

    @property
    def is_first(self) -> bool:
        return self.stage == 0

    @property
    def is_last(self) -> bool:
        return self.stage == self.num_stages - 1

    def layer_range(self, num_layers: int) -> range:
        """The decoder layers of this stage: consecutive, as even as the count allows."""
        if num_layers < self.num_stages:
            raise ValueError(f"--pipeline-parallel-size {self.num_stages} exceeds the model's "
                             f"{num_layers} layers")
        return range(self.stage * num_layers // self.num_stages,
                     (self.stage + 1) * num_layers // self.num_stages)

    def global_rank(self, stage: int) -> int:
        """The rank of stage ``stage`` that has this rank's tensor-parallel position."""
        return stage * self.tp_size + self.world.rank % self.tp_size

    def send(self, tensor: torch.Tensor, rank: int) -> None:
        self.world.device_group.send([tensor.contiguous()], rank, 0).wait()

    def recv(self, tensor: torch.Tensor, rank: int) -> torch.Tensor:
        self.world.device_group.recv([tensor], rank, 0).wait()
        return tensor


SINGLE_STAGE = PPGroup()
_building: tuple[TPGroup, PPGroup] | None = None


@contextlib.contextmanager
def model_parallel(tp: TPGroup, pp: PPGroup = SINGLE_STAGE) -> Iterator[None]:
    """Layers built inside take ``tp``, models ``pp``. Nesting is a bug and raises."""
    global _building
    if _building is not None:
        raise RuntimeError("model_parallel() contexts cannot be nested")
    _building = (tp, pp)
    try:
        yield
    finally:
        _building = None


def tensor_parallel(group: TPGroup):
    """``model_parallel(group)``: tensor parallelism alone."""
    return model_parallel(group)


def current_tp_group() -> TPGroup:
    """The group of the model being built; the one-rank group outside ``model_parallel``."""
    return _building[0] if _building else SINGLE


def current_pp_group() -> PPGroup:
    """The pipeline stage of the model being built; the only stage outside ``model_parallel``."""
    return _building[1] if _building else SINGLE_STAGE


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


def make_groups(store: dist.Store, rank: int, tp_size: int, pp_size: int,
                device: torch.device, timeout_s: float) -> tuple[TPGroup, PPGroup]:
    """Global rank ``rank``'s tensor-parallel group (its stage's ranks) and pipeline
    stage; every rank must call it. With one stage the world is the tensor-parallel group."""
    world = make_tp_group(dist.PrefixStore("world", store), rank, tp_size * pp_size, device,
                          timeout_s)
    stage = rank // tp_size
    if pp_size == 1:
        return world, PPGroup(0, 1, tp_size, world)
    tp = make_tp_group(dist.PrefixStore(f"stage{stage}", store), rank % tp_size, tp_size,
                       device, timeout_s)
    return tp, PPGroup(stage, pp_size, tp_size, world)
