"""A real ``tamis serve`` subprocess for the tests that drive it over HTTP.

``live_server(log_dir, api_key)`` starts the embedded SmolLM2 on CPU on a free loopback
port, yields its base URL (``http://127.0.0.1:PORT``) once ``/v1/models`` answers (the model
is loaded: ``/health`` alone may answer while it loads), then stops it with SIGTERM and
asserts a clean shutdown. The server's log is ``log_dir / "serve.log"``; its tail is printed
on exit and quoted when the server fails to come up. ``server_fixture(scope, api_key)``
makes a pytest fixture ``server`` of it, one server per ``scope``.
"""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import httpx
import pytest

MODEL_NAME = "smol"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def live_server(log_dir: Path, api_key: str, timeout: float = 180) -> Iterator[str]:
    port = free_port()
    log_path = log_dir / "serve.log"
    # One torch thread: on a shared 2-core runner two threads spin against each other.
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    cmd = [sys.executable, "-m", "tamis.cli", "serve", "--port", str(port), "--api-key", api_key,
           "--served-model-name", MODEL_NAME, "--max-model-len", "2048", "--seed", "0",
           "--log-level", "info"]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_loaded(base, api_key, proc, log_path, timeout)
        yield base
    finally:
        code = _stop(proc)
        print(f"server exited with {code}; log tail:\n{log_path.read_text()[-3000:]}")
    # uvicorn re-raises the captured SIGTERM after its graceful shutdown (exit -15).
    assert code in (0, -signal.SIGTERM), f"tamis serve exited with {code}"
    assert "Application shutdown complete" in log_path.read_text()


def server_fixture(scope: str, api_key: str):
    @pytest.fixture(scope=scope, name="server")
    def server(tmp_path_factory):
        with live_server(tmp_path_factory.mktemp("serve"), api_key) as base:
            yield base
    return server


def _stop(proc: subprocess.Popen) -> int | str:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        return "killed"


def _wait_loaded(base: str, api_key: str, proc: subprocess.Popen, log_path: Path,
                 timeout: float) -> None:
    deadline = time.monotonic() + timeout
    headers = {"Authorization": f"Bearer {api_key}"}
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"tamis serve exited early:\n{log_path.read_text()[-4000:]}")
        try:
            if httpx.get(base + "/v1/models", headers=headers, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"tamis serve not loaded after {timeout}s:\n{log_path.read_text()[-4000:]}")
