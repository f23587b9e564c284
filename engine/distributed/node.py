"""``python -m tamis.engine.distributed.node``: the ranks of a host other than node 0, or
under torchrun, any one rank.

Every host runs world_size / nnodes consecutive ranks; node 0 runs rank 0 (the engine:
``tamis serve`` or ``LLM``) and the rendezvous store. Every other host runs this module
with the same engine flags but its own ``--node-rank``::

    node 0:  tamis serve --model M -tp 4 -pp 2 --nnodes 2 --node-rank 0 --master-addr 10.0.0.1
    node 1:  python -m tamis.engine.distributed.node --model M -tp 4 -pp 2 --nnodes 2 \\
                 --node-rank 1 --master-addr 10.0.0.1

Its ranks load their shards and then run what rank 0 sends through the store. It exits
when they do: 0 once rank 0 stopped them (or is gone), 1 if one of them failed.

Under torchrun every process is one rank, and every host runs the same command, led by
what rank 0 runs (``serve`` or ``generate``, with that command's flags)::

    torchrun --nnodes 2 --nproc-per-node 4 --node-rank R --master-addr 10.0.0.1 \\
        --master-port 29500 -m tamis.engine.distributed.node serve --model M -tp 4 -pp 2

Rank 0 runs ``tamis serve`` (or ``tamis generate``) with the hosts, its host and the store
taken from torchrun's environment (``torchrun.py``); every other rank runs its shard and
exits as above.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import NoReturn

from tamis.engine.config import EngineConfig
from tamis.engine.distributed.torchrun import NODE_FLAGS, TorchrunRank
from tamis.engine.distributed.workers import (STARTUP_TIMEOUT_S, ranks_per_node, run_rank,
                                              spawn_ranks)

logger = logging.getLogger(__name__)

# What rank 0 may run under torchrun: tamis's commands that build an engine.
RANK0_COMMANDS = ("serve", "generate")


def run_node(config: EngineConfig) -> int:
    """Starts this host's ranks and waits for them; the exit status (see the module)."""
    if config.node_rank == 0:
        raise ValueError("--node-rank 0 runs the engine itself: start it with tamis serve "
                         "(or LLM(...)) and these flags")
    local = ranks_per_node(config)
    first = config.node_rank * local
    ranks = range(first, first + local)
    device = config.resolved_device()
    processes, _ = spawn_ranks(config, ranks, (config.master_addr, config.master_port),
                               device.type, with_pipes=False)
    logger.info("node %d: ranks %d..%d started, joining %s:%d", config.node_rank, ranks[0],
                ranks[-1], config.master_addr, config.master_port)
    for process in processes.values():
        process.join()
    failed = [rank for rank, process in processes.items() if process.exitcode != 0]
    if failed:
        logger.error("node %d: rank(s) %s failed", config.node_rank, failed)
    return 1 if failed else 0


def run_torchrun_rank(launch: TorchrunRank, argv: list[str]) -> int:
    """Rank ``launch.rank`` of a torchrun launch of ``tamis <argv>`` (``argv[0]`` one of
    ``RANK0_COMMANDS``): rank 0 runs that command, any other rank its shard (and does not
    return: ``run_rank`` exits the process). SystemExit when the flags do not fit the
    launch."""
    try:
        args, config = _parse_for_torchrun(launch, argv)
    except ValueError as exc:
        raise SystemExit(f"torchrun rank {launch.rank}: {exc}") from None
    if launch.rank == 0:
        _exit_without_teardown(int(args.func(args) or 0))
    _setup_logging()
    logger.info("torchrun rank %d (local rank %d of node %d) joining %s:%d", launch.rank,
                launch.local_rank, launch.node_rank, launch.master_addr, launch.master_port)
    run_rank(config, launch.rank, launch.local_rank,
             lambda: launch.connect_store(STARTUP_TIMEOUT_S), config.resolved_device().type)


def _exit_without_teardown(code: int) -> NoReturn:
    """Ends rank 0's process as ``run_rank`` ends the others': output flushed, then
    ``os._exit``. The command has stopped the other ranks by then; interpreter teardown
    would destroy process groups whose peers are gone, which can abort the process from
    C++ ("terminate called without an active exception") after a successful run."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _parse_for_torchrun(launch: TorchrunRank,
                        argv: list[str]) -> tuple[argparse.Namespace, EngineConfig]:
    """``tamis <argv>``'s arguments, the hosts and the store taken from torchrun, and the
    engine config they make; ValueError when they do not fit the launch."""
    from tamis.cli import build_parser

    given = [arg for arg in argv if arg.split("=")[0] in NODE_FLAGS]
    if given:
        raise ValueError(f"torchrun's environment sets {', '.join(NODE_FLAGS)}: drop "
                         f"{' '.join(given)}")
    args = build_parser().parse_args([*argv, *launch.node_flags()])
    if getattr(args, "model_tag", None) is not None:   # tamis serve MODEL
        args.model = args.model or args.model_tag
    config = EngineConfig.from_cli_args(args)
    launch.check(config)
    return args, config


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    launch = TorchrunRank.from_environ()
    if argv and argv[0] in RANK0_COMMANDS:
        if launch is None:
            raise SystemExit(f"{argv[0]}: for a launch under torchrun (torchrun ... -m "
                             f"tamis.engine.distributed.node {argv[0]} ...); on node 0, run "
                             f"tamis {argv[0]} itself")
        return run_torchrun_rank(launch, argv)
    if launch is not None:
        raise SystemExit(f"under torchrun, name what rank 0 runs first: "
                         f"{' or '.join(RANK0_COMMANDS)} (then its flags)")
    from tamis.engine.arg_utils import add_engine_args

    parser = argparse.ArgumentParser(prog="python -m tamis.engine.distributed.node",
                                     description="the ranks of a host other than node 0; "
                                                 "under torchrun: serve|generate FLAGS")
    add_engine_args(parser)
    _setup_logging()
    return run_node(EngineConfig.from_cli_args(parser.parse_args(argv)))


def _setup_logging() -> None:
    """Rank 0 leaves logging to the command it runs (``tamis serve --log-level``)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")


if __name__ == "__main__":
    sys.exit(main())
