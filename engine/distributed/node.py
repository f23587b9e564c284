"""``python -m tamis.engine.distributed.node``: the ranks of a host other than node 0.

Every host runs world_size / nnodes consecutive ranks; node 0 runs rank 0 (the engine:
``tamis serve`` or ``LLM``) and the rendezvous store. Every other host runs this module
with the same engine flags but its own ``--node-rank``::

    node 0:  tamis serve --model M -tp 4 -pp 2 --nnodes 2 --node-rank 0 --master-addr 10.0.0.1
    node 1:  python -m tamis.engine.distributed.node --model M -tp 4 -pp 2 --nnodes 2 \\
                 --node-rank 1 --master-addr 10.0.0.1

Its ranks load their shards and then run what rank 0 sends through the store. It exits
when they do: 0 once rank 0 stopped them (or is gone), 1 if one of them failed.
"""
from __future__ import annotations

import argparse
import logging
import sys

from tamis.engine.arg_utils import add_engine_args
from tamis.engine.config import EngineConfig
from tamis.engine.distributed.workers import ranks_per_node, spawn_ranks

logger = logging.getLogger(__name__)


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tamis.engine.distributed.node",
                                     description="the ranks of a host other than node 0")
    add_engine_args(parser)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    return run_node(EngineConfig.from_cli_args(parser.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
