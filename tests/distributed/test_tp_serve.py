"""``tamis serve --tensor-parallel-size 2`` on the CPU: the engine core process starts its
second rank, answers a completion with TP=1's text, and stops cleanly on SIGTERM."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import httpx

from live_server import _wait_loaded, free_port
from tp_helpers import greedy, make_engine, run

PROMPT = "The quick brown fox"


def test_serve_with_two_ranks_answers_like_one(tiny_checkpoint, tmp_path):
    model = tiny_checkpoint("llama")
    engine = make_engine(model, 1)
    want = run(engine, [PROMPT], greedy(8, logprobs=None))[0].outputs[0].text
    engine.shutdown()
    port, log_path = free_port(), tmp_path / "serve.log"
    cmd = [sys.executable, "-m", "tamis.cli", "serve", "--model", str(model), "--port", str(port),
           "--api-key", "k", "--tensor-parallel-size", "2", "--max-model-len", "256",
           "--kv-cache-memory", "32MiB", "--dtype", "float32", "--device", "cpu"]
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_loaded(base, "k", proc, log_path, timeout=180)
        body = {"model": str(model), "prompt": PROMPT, "max_tokens": 8, "temperature": 0,
                "ignore_eos": True}
        reply = httpx.post(base + "/v1/completions", json=body, timeout=60,
                           headers={"Authorization": "Bearer k"})
        assert reply.status_code == 200, reply.text
        assert reply.json()["choices"][0]["text"] == want
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
    assert code in (0, -signal.SIGTERM), log_path.read_text()[-3000:]
