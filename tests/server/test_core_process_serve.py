"""`tamis serve` with its engine core in a process of its own (the default), over HTTP:
``/health`` stays fast while the core runs a full batch, engine stats reach ``/metrics``,
a client that leaves frees its KV blocks in the core, and a killed core turns into 503s
and a server that exits with 1 (so a supervisor restarts it), within a bounded time."""
from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from live_server import free_port, server_fixture

KEY = "sk-tamis-core"
HEADERS = {"Authorization": f"Bearer {KEY}"}
BATCH = 32   # concurrent requests: the core's batch while /health is probed

server = server_fixture("module", KEY)


def metric(base: str, name: str) -> float:
    text = httpx.get(base + "/metrics", timeout=10).text
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line.startswith(name + "{") or line.startswith(name + " ")]
    assert values, f"{name} missing from /metrics"
    return sum(values)


async def _long_completion(http: httpx.AsyncClient, i: int) -> httpx.Response:
    body = {"prompt": f"Story number {i}: " + "once upon a time " * 40, "max_tokens": 48,
            "ignore_eos": True, "temperature": 0}
    return await http.post("/v1/completions", json=body)


async def _probe_health(base: str, num_probes: int) -> list[float]:
    latencies = []
    async with httpx.AsyncClient(base_url=base, timeout=10) as http:
        for _ in range(num_probes):
            started = time.perf_counter()
            response = await http.get("/health")
            latencies.append(time.perf_counter() - started)
            assert response.status_code == 200
            await asyncio.sleep(0.05)
    return latencies


def test_health_answers_fast_while_the_core_runs_a_full_batch(server):
    async def main():
        async with httpx.AsyncClient(base_url=server, headers=HEADERS, timeout=300,
                                     limits=httpx.Limits(max_connections=BATCH + 4)) as http:
            work = asyncio.gather(*(_long_completion(http, i) for i in range(BATCH)))
            while metric(server, "tamis:num_requests_running") < BATCH // 2:
                await asyncio.sleep(0.05)
            latencies = await _probe_health(server, 20)
            running_after = metric(server, "tamis:num_requests_running")
            usage = metric(server, "tamis:kv_cache_usage_perc")
            responses = await work
        return latencies, running_after, usage, responses

    latencies, running_after, usage, responses = asyncio.run(main())
    assert all(r.status_code == 200 for r in responses)
    assert running_after > 0, "the batch ended before the probes did: make it longer"
    assert usage > 0   # engine stats come up from the core with its steps
    latencies.sort()
    p90 = latencies[int(0.9 * len(latencies)) - 1]
    assert statistics.median(latencies) < 0.1 and p90 < 0.1, \
        f"/health took {[round(x * 1000) for x in latencies]} ms"


def test_a_client_that_leaves_frees_its_blocks_in_the_core(server):
    async def main():
        body = {"prompt": "A long story:", "max_tokens": 400, "stream": True,
                "ignore_eos": True}
        async with httpx.AsyncClient(base_url=server, headers=HEADERS, timeout=120) as http:
            async with http.stream("POST", "/v1/completions", json=body) as response:
                chunks = 0
                async for line in response.aiter_lines():
                    chunks += line.startswith("data: {")
                    if chunks == 3:
                        return metric(server, "tamis:kv_cache_usage_perc")

    used = asyncio.run(main())
    assert used > 0
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if (metric(server, "tamis:num_requests_running") == 0
                and metric(server, "tamis:kv_cache_usage_perc") == 0):
            break
        time.sleep(0.1)
    assert metric(server, "tamis:num_requests_running") == 0
    assert metric(server, "tamis:kv_cache_free_blocks") == metric(server,
                                                                  "tamis:kv_cache_total_blocks")


def _children(pid: int) -> list[tuple[int, str]]:
    """(pid, command line) of ``pid``'s child processes (Linux /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append((int(entry.name), cmdline))
    return found


def _core_pid(server_pid: int) -> int:
    cores = [pid for pid, cmd in _children(server_pid)
             if "spawn_main" in cmd and "resource_tracker" not in cmd]
    assert len(cores) == 1, _children(server_pid)
    return cores[0]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_killed_core_gives_503s_and_the_server_exits_non_zero(tmp_path):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    log_path = tmp_path / "serve.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tamis.cli", "serve", "--port", str(port),
             "--max-model-len", "1024", "--seed", "0"], stdout=log, stderr=subprocess.STDOUT,
            env=env)
    try:
        _wait_ready(base, proc, log_path)
        core = _core_pid(proc.pid)

        async def main():
            async with httpx.AsyncClient(base_url=base, timeout=60) as http:
                body = {"prompt": "Count to a thousand:", "max_tokens": 1000,
                        "ignore_eos": True}
                in_flight = asyncio.ensure_future(http.post("/v1/completions", json=body))
                while metric(base, "tamis:num_requests_running") < 1:
                    await asyncio.sleep(0.05)
                os.kill(core, 9)
                return await in_flight

        killed_at = time.monotonic()
        response = asyncio.run(main())
        assert response.status_code == 503, response.text
        error = response.json()["error"]
        assert error["code"] == "engine_unavailable" and "SIGKILL" in error["message"]
        code = proc.wait(timeout=60)
        assert code == 1, f"tamis serve exited with {code}"
        assert time.monotonic() - killed_at < 60
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "engine core died" in log_path.read_text()


def _wait_ready(base: str, proc: subprocess.Popen, log_path: Path, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, log_path.read_text()[-3000:]
        try:
            if httpx.get(base + "/ready", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise AssertionError(f"not ready after {timeout} s:\n{log_path.read_text()[-3000:]}")
