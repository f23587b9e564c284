"""Ranks started by torchrun (``torch.distributed.run``): every process it starts is one rank.

torchrun tells each process its place through the environment (the env:// contract)::

    RANK, WORLD_SIZE              the global rank and the number of ranks (tp x pp)
    LOCAL_RANK, LOCAL_WORLD_SIZE  its index among the ranks of its host (its GPU), their count
    GROUP_RANK                    the host's index (tamis's --node-rank)
    MASTER_ADDR, MASTER_PORT      the rendezvous store; with TORCHELASTIC_USE_AGENT_STORE=True
                                  torchrun's agent on node 0 serves it, else rank 0 does

Rank 0 runs the engine as ``tamis serve`` or ``LLM`` would, except that it starts no rank
process: the others are torchrun's, and they join it through the store
(``WorkerPool.start``). ``python -m tamis.engine.distributed.node serve|generate ...`` is the
program torchrun runs on every host (``node.py``).
"""
from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Mapping

import torch.distributed as dist

# The variables torchrun sets for every process it starts; all of them mean torchrun.
_REQUIRED = ("TORCHELASTIC_RUN_ID", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
             "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")
# tamis's flags that torchrun's environment decides.
NODE_FLAGS = ("--nnodes", "--node-rank", "--master-addr", "--master-port")


@dataclass(frozen=True)
class TorchrunRank:
    """This process's place in a torchrun launch."""
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    master_addr: str
    master_port: int
    restart_count: int = 0

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] = os.environ) -> "TorchrunRank | None":
        """This process's place, or None when torchrun did not start it."""
        if any(name not in environ for name in _REQUIRED):
            return None
        return cls(int(environ["RANK"]), int(environ["WORLD_SIZE"]),
                   int(environ["LOCAL_RANK"]), int(environ["LOCAL_WORLD_SIZE"]),
                   int(environ["GROUP_RANK"]), environ["MASTER_ADDR"],
                   int(environ["MASTER_PORT"]),
                   int(environ.get("TORCHELASTIC_RESTART_COUNT", "0")))

    @property
    def nnodes(self) -> int:
        return self.world_size // self.local_world_size

    def node_flags(self) -> list[str]:
        """The tamis flags that describe this launch (hosts, this host, the store)."""
        return ["--nnodes", str(self.nnodes), "--node-rank", str(self.node_rank),
                "--master-addr", self.master_addr, "--master-port", str(self.master_port)]

    def check(self, config) -> None:
        """ValueError unless torchrun started as many ranks as ``config`` runs on."""
        if self.world_size != config.world_size:
            raise ValueError(
                f"torchrun started {self.world_size} process(es) ({self.nnodes} node(s) x "
                f"--nproc-per-node {self.local_world_size}) but --tensor-parallel-size "
                f"{config.tensor_parallel_size} x --pipeline-parallel-size "
                f"{config.pipeline_parallel_size} runs on {config.world_size}: make "
                f"torchrun's --nnodes x --nproc-per-node equal to it")

    def connect_store(self, timeout_s: float) -> dist.Store:
        """The launch's rendezvous store, as ``init_process_group("env://")`` finds it
        (torchrun's agent's, or one rank 0 serves), under keys of tamis's own: an agent's
        store also holds torchrun's keys, and those of earlier restarts."""
        store, _, _ = next(dist.rendezvous("env://", self.rank, self.world_size,
                                           timeout=datetime.timedelta(seconds=timeout_s)))
        return dist.PrefixStore(f"tamis/restart{self.restart_count}", store)


__all__ = ["NODE_FLAGS", "TorchrunRank"]
