"""Startup: a busy port fails before the model loads; liveness and readiness while it loads."""
from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import uvicorn
from fake_engine import FakeEngine
from transformers import AutoTokenizer

from tamis.engine.async_engine import AsyncEngine
from tamis.server.app import build_app
from tamis.server.context import ServerContext
from tamis.server.startup import LoadingGate, bind_listening_socket, serve_while_loading

HEAVY_MODULES = ("torch", "transformers", "fastapi", "uvicorn")


def test_tamis_serve_on_a_busy_port_exits_at_once_naming_it():
    tamis = Path(sys.executable).with_name("tamis")
    assert tamis.exists(), "the `tamis` entry point is not installed next to this Python"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        elapsed, done = _timed([str(tamis), "serve", "--port", str(port)])
    assert done.returncode != 0
    assert f"port {port}" in done.stderr and "already in use" in done.stderr, done.stderr
    assert "KV cache" not in done.stderr and "serving" not in done.stderr   # no load began
    # ~0.15 s on an idle machine (torch is not imported yet); on a busy one, within twice
    # what starting the CLI alone takes there.
    cli_start, _ = _timed([str(tamis), "serve", "--help"])
    assert elapsed < max(1.0, 2 * cli_start), f"took {elapsed:.2f}s (the CLI alone {cli_start:.2f}s)"


def test_a_busy_port_is_found_before_the_heavy_modules_are_imported(tmp_path):
    code = ("import sys\n"
            "from tamis.cli import main\n"
            "try:\n"
            "    main(['serve', '--port', sys.argv[1]])\n"
            "except SystemExit as exc:\n"
            "    print('exit', exc.code != 0)\n"
            f"print(sorted(name for name in {HEAVY_MODULES!r} if name in sys.modules))\n")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        done = subprocess.run([sys.executable, "-c", code, str(taken.getsockname()[1])],
                              cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.stdout.split("\n")[:2] == ["exit True", "[]"], done.stdout + done.stderr


def _timed(cmd: list[str]) -> tuple[float, subprocess.CompletedProcess]:
    start = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    return time.monotonic() - start, done


def test_bind_names_an_address_it_cannot_use():
    with pytest.raises(SystemExit, match=r"cannot listen on 203\.0\.113\.1:\d+"):
        bind_listening_socket("203.0.113.1", 0)   # TEST-NET-3: not an address of this host


@pytest.fixture
def app_of(smollm2_path):
    tokenizer = AutoTokenizer.from_pretrained(smollm2_path)
    engines = []

    def make(api_key=None):
        engine = AsyncEngine(FakeEngine(tokenizer))
        engines.append(engine)
        ctx = ServerContext(engine=engine, tokenizer=tokenizer, model_names=["smol"],
                            max_model_len=256)
        return build_app(ctx, api_key=api_key)
    yield make, engines
    for engine in engines:
        engine.shutdown()


class _Running:
    """A uvicorn server over ``app`` on a free loopback port, in a thread."""

    def __init__(self, app):
        self.sock = bind_listening_socket("127.0.0.1", 0)
        self.base = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, lifespan="on", log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, args=([self.sock],))

    def __enter__(self):
        self.thread.start()
        _poll(lambda: httpx.get(self.base + "/health").status_code == 200)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(30)
        assert not self.thread.is_alive()


def _poll(condition, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if condition():
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


def test_liveness_answers_while_the_model_loads_and_readiness_once_loaded(app_of):
    make, engines = app_of
    release = threading.Event()

    def build():
        release.wait(30)
        return make()

    with _Running(LoadingGate(build, on_failure=lambda: None)) as running:
        assert httpx.get(running.base + "/health").status_code == 200
        for path in ("/ready", "/readyz", "/v1/models", "/metrics"):
            r = httpx.get(running.base + path)
            assert r.status_code == 503, path
            assert r.headers["retry-after"] == "5"
            assert r.json()["error"]["code"] == "model_loading"
        release.set()
        _poll(lambda: httpx.get(running.base + "/ready").status_code == 200)
        assert httpx.get(running.base + "/readyz").status_code == 200
        assert httpx.get(running.base + "/v1/models").json()["data"][0]["id"] == "smol"
        engine = engines[0]
        assert engine.is_alive
    assert not engine.is_alive   # the built app's shutdown stopped its engine


def test_readiness_and_liveness_fail_once_the_engine_died(app_of):
    make, engines = app_of
    app = make(api_key="sk-probe")
    with _Running(LoadingGate(lambda: app, on_failure=lambda: None)) as running:
        _poll(lambda: httpx.get(running.base + "/ready").status_code == 200)   # no key needed
        assert httpx.get(running.base + "/v1/models").status_code == 401
        engines[0].shutdown()
        for path in ("/health", "/ready"):
            r = httpx.get(running.base + path)
            assert r.status_code == 503 and r.json()["error"]["code"] == "engine_unavailable"


def test_a_failed_load_stops_the_server_with_its_message():
    def build():
        raise RuntimeError("no weights in /nowhere")

    sock = bind_listening_socket("127.0.0.1", 0)
    start = time.monotonic()
    with pytest.raises(SystemExit, match="loading the model failed: no weights in /nowhere"):
        serve_while_loading(sock, build, log_level="warning")
    assert time.monotonic() - start < 10
