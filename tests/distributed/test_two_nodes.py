"""Two hosts simulated on loopback: node 1 is a separately launched process group
(``python -m tamis.engine.distributed.node``) that joins node 0's engine through the
rendezvous store; TP=2 over the two nodes gives TP=1's tokens, and node 1 exits with 0
once the engine stops its rank."""
from __future__ import annotations

import os
import subprocess
import sys

from live_server import free_port
from tp_helpers import greedy, make_engine, run

PROMPTS = [list(range(300, 340)), list(range(1000, 1013))]


def test_a_rank_on_a_second_node_joins_the_engine(tiny_checkpoint, tmp_path):
    model = tiny_checkpoint("llama")
    port = free_port()
    common = dict(dtype="float32", kv_cache_memory_bytes="32MiB", max_model_len=256,
                  max_num_seqs=8)
    cmd = [sys.executable, "-m", "tamis.engine.distributed.node", "--model", str(model),
           "--tensor-parallel-size", "2", "--nnodes", "2", "--node-rank", "1",
           "--master-addr", "127.0.0.1", "--master-port", str(port), "--dtype", "float32",
           "--kv-cache-memory", "32MiB", "--max-model-len", "256", "--max-num-seqs", "8",
           "--device", "cpu"]
    log_path = tmp_path / "node1.log"
    with open(log_path, "w") as log:
        node1 = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                 env=dict(os.environ, OMP_NUM_THREADS="1"))
    try:
        engine = make_engine(model, 2, nnodes=2, node_rank=0, master_port=port, **common)
        try:
            got = [out.outputs[0].token_ids for out in run(engine, PROMPTS, greedy(8, None))]
            assert engine.runner.workers.processes == {}   # rank 1 is node 1's
        finally:
            engine.shutdown()
        code = node1.wait(timeout=60)
    finally:
        if node1.poll() is None:
            node1.kill()
    assert code == 0, log_path.read_text()[-3000:]
    reference = make_engine(model, 1, **common)
    want = [out.outputs[0].token_ids for out in run(reference, PROMPTS, greedy(8, None))]
    assert got == want
