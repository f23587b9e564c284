"""Launching under torchrun: ``torchrun --nproc-per-node 2 -m tamis.engine.distributed.node
generate|serve ...`` makes each process one rank (rank 0 the engine, rank 1 its shard), which
prints, or serves, TP=1's greedy text; how torchrun's environment is read and checked."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import httpx
import psutil
import pytest

from tamis.engine.config import EngineConfig
from tamis.engine.distributed.node import main as node_main
from tamis.engine.distributed.torchrun import TorchrunRank
from live_server import _wait_loaded, free_port
from tp_helpers import greedy, make_engine, run

PROMPTS = ["The quick brown fox", "Once upon a time there was"]
MAX_TOKENS = 8
ENGINE_FLAGS = ["--dtype", "float32", "--kv-cache-memory", "32MiB", "--max-model-len", "256",
                "--device", "cpu"]
# torchrun's variables for rank 2 of 4, two per host: the second host's first rank.
ENVIRON = {"TORCHELASTIC_RUN_ID": "run", "RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "0",
           "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1", "MASTER_ADDR": "10.0.0.1",
           "MASTER_PORT": "29500", "TORCHELASTIC_RESTART_COUNT": "3"}


def _torchrun_command(args: list[str], launch: tuple[str, ...] = ("--standalone",
                                                                  "--nproc-per-node", "2")
                      ) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", *launch, "-m",
            "tamis.engine.distributed.node", *args]


ENV = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")


def _torchrun(args: list[str], timeout_s: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(_torchrun_command(args), capture_output=True, text=True,
                          timeout=timeout_s, env=ENV)


def _tp1_texts(model) -> list[str]:
    engine = make_engine(model, 1)
    want = [out.outputs[0].text for out in run(engine, PROMPTS, greedy(MAX_TOKENS, None))]
    engine.shutdown()
    assert all(want)   # an empty text would make the comparisons vacuous
    return want


def test_two_torchrun_ranks_generate_like_one(tiny_checkpoint):
    model = tiny_checkpoint("llama")
    want = _tp1_texts(model)

    done = _torchrun(["generate", "--model", str(model), "--tensor-parallel-size", "2",
                      *ENGINE_FLAGS, "--max-tokens", str(MAX_TOKENS), "--ignore-eos",
                      *PROMPTS])

    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout == "".join(f"### {p}\n{text}\n" for p, text in zip(PROMPTS, want))
    assert "torchrun rank 1 (local rank 1 of node 0)" in done.stderr


def test_two_torchrun_nodes_generate_like_one(tiny_checkpoint, tmp_path):
    """Two hosts on loopback, one rank each: node 1's torchrun joins node 0's (static
    rendezvous at --master-addr:--master-port), its rank is rank 1, local rank 0."""
    model = tiny_checkpoint("llama")
    want = _tp1_texts(model)
    port = free_port()
    args = ["generate", "--model", str(model), "--tensor-parallel-size", "2", *ENGINE_FLAGS,
            "--max-tokens", str(MAX_TOKENS), "--ignore-eos", *PROMPTS]
    nodes = []
    for node in (0, 1):
        launch = ("--nnodes", "2", "--nproc-per-node", "1", "--node-rank", str(node),
                  "--master-addr", "127.0.0.1", "--master-port", str(port))
        with open(tmp_path / f"{node}.out", "w") as out, open(tmp_path / f"{node}.err", "w") as err:
            nodes.append(subprocess.Popen(_torchrun_command(args, launch), stdout=out,
                                          stderr=err, env=ENV))
    try:
        codes = [node.wait(timeout=120) for node in nodes]
    finally:
        for node in nodes:
            if node.poll() is None:
                node.kill()
    out0, out1, err0, err1 = [(tmp_path / name).read_text()
                              for name in ("0.out", "1.out", "0.err", "1.err")]
    assert codes == [0, 0], (err0 + err1)[-3000:]
    assert out0 == "".join(f"### {p}\n{text}\n" for p, text in zip(PROMPTS, want))
    assert out1 == ""
    assert "torchrun rank 1 (local rank 0 of node 1)" in err1


def test_two_torchrun_ranks_serve_like_one(tiny_checkpoint, tmp_path):
    model = tiny_checkpoint("llama")
    want = _tp1_texts(model)
    port, log_path = free_port(), tmp_path / "torchrun.log"
    with open(log_path, "w") as log:
        launcher = subprocess.Popen(_torchrun_command(
            ["serve", "--model", str(model), "--port", str(port), "--api-key", "k",
             "--tensor-parallel-size", "2", *ENGINE_FLAGS]), stdout=log,
            stderr=subprocess.STDOUT, env=ENV)
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_loaded(base, "k", launcher, log_path, timeout=120)
        launched = psutil.Process(launcher.pid).children(recursive=True)   # ranks, engine core
        body = {"model": str(model), "prompt": PROMPTS, "max_tokens": MAX_TOKENS,
                "temperature": 0, "ignore_eos": True}
        reply = httpx.post(base + "/v1/completions", json=body, timeout=60,
                           headers={"Authorization": "Bearer k"})
        assert reply.status_code == 200, reply.text
        choices = sorted(reply.json()["choices"], key=lambda choice: choice["index"])
        assert [choice["text"] for choice in choices] == want
    finally:
        launcher.send_signal(signal.SIGTERM)   # torchrun stops every rank
        launcher.wait(60)
    _, alive = psutil.wait_procs(launched, timeout=30)
    assert not alive, log_path.read_text()[-3000:]


def test_a_world_size_torchrun_did_not_start_is_refused(tiny_checkpoint):
    done = _torchrun(["generate", "--model", str(tiny_checkpoint("llama")),
                      "--tensor-parallel-size", "4", *ENGINE_FLAGS, "x"], timeout_s=60)
    assert done.returncode != 0
    assert "torchrun started 2 process(es)" in done.stderr
    assert "--tensor-parallel-size 4" in done.stderr


def test_torchrun_environment_sets_the_node_flags():
    launch = TorchrunRank.from_environ(ENVIRON)
    assert (launch.rank, launch.local_rank, launch.node_rank, launch.nnodes) == (2, 0, 1, 2)
    assert launch.node_flags() == ["--nnodes", "2", "--node-rank", "1", "--master-addr",
                                   "10.0.0.1", "--master-port", "29500"]
    assert TorchrunRank.from_environ({k: v for k, v in ENVIRON.items() if k != "RANK"}) is None
    launch.check(EngineConfig(model="m", tensor_parallel_size=2, pipeline_parallel_size=2))
    with pytest.raises(ValueError, match="torchrun started 4 process"):
        launch.check(EngineConfig(model="m", tensor_parallel_size=2))


@pytest.mark.parametrize("argv,environ,message", [
    (["serve", "--model", "m"], {}, "for a launch under torchrun"),
    (["--model", "m", "-tp", "4"], ENVIRON, "name what rank 0 runs first"),
    (["serve", "--model", "m", "-tp", "4", "--master-port=1"], ENVIRON, "drop --master-port=1"),
])
def test_node_refuses_a_launch_it_cannot_run(argv, environ, message, monkeypatch):
    for name in ENVIRON:
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit, match=message):
        node_main(argv)
