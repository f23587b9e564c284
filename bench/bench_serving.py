"""W3 serving benchmark: `tamis serve` under N concurrent streaming clients.

For each concurrency level, ``--num-prompts`` requests of ``--input-len`` random token ids
(fresh per level, so the prefix cache cannot help) ask for exactly ``--output-len`` tokens
(``ignore_eos``) from ``/v1/completions`` with ``stream=true``; N clients each send their
next request as soon as the previous one ends. Measured per request: TTFT (send -> first
token chunk) and TPOT ((last - first token) / (tokens - 1)); per level: requests/s and
output tokens/s over the wall time.

Both sides first serve two warm-up requests (first forward passes are slow). Baseline,
same machine, same run: the same requests through ``LLMEngine`` in this process
(no HTTP, no asyncio), keeping N requests in flight. ``ratio`` = server output tok/s /
engine output tok/s: what the HTTP layer costs.

  python bench/bench_serving.py                                  # CPU, embedded SmolLM2
  python bench/bench_serving.py --engine-args "--load-format dummy --model /path/llama" \\
      --input-len 512 --output-len 128 --concurrency 16 64 256      # W3 as written, on GPU
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field

import httpx


@dataclass
class RequestResult:
    ttft: float
    tpot: float | None
    output_tokens: int
    ok: bool = True
    error: str = ""


@dataclass
class LevelResult:
    concurrency: int
    wall: float
    results: list[RequestResult] = field(default_factory=list)

    @property
    def ok(self) -> list[RequestResult]:
        return [r for r in self.results if r.ok]

    @property
    def output_tokens(self) -> int:
        return sum(r.output_tokens for r in self.ok)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    k = (len(values) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def random_prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    low = 100  # skip the special and byte tokens at the start of the vocabulary
    return [[rng.randrange(low, vocab) for _ in range(length)] for _ in range(n)]


# ---------------------------------------------------------------- the server side

def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch_server(engine_args: str, port: int, log_path: str, max_waiting: int,
                  threads: int | None):
    cmd = [sys.executable, "-P", "-m", "tamis.cli", "serve", "--port", str(port),
           "--served-model-name", "bench", "--log-level", "warning",
           "--max-waiting", str(max_waiting), *shlex.split(engine_args)]
    env = dict(os.environ)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    log = open(log_path, "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"tamis serve exited: see {log_path}")
        try:
            if httpx.get(base + "/ready", timeout=1).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"tamis serve did not become ready: see {log_path}")


async def one_request(http: httpx.AsyncClient, prompt: list[int], output_len: int,
                      api_key: str | None) -> RequestResult:
    body = {"model": "bench", "prompt": prompt, "max_tokens": output_len, "stream": True,
            "ignore_eos": True, "temperature": 1.0,
            "stream_options": {"include_usage": True}}
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    start = time.perf_counter()
    first = last = None
    tokens = 0
    async with http.stream("POST", "/v1/completions", json=body, headers=headers) as resp:
        if resp.status_code != 200:
            return RequestResult(0, None, 0, False, f"{resp.status_code} {await resp.aread()!r}")
        async for line in resp.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            elif chunk.get("choices"):
                now = time.perf_counter()
                first = first or now
                last = now
            elif "error" in chunk:
                return RequestResult(0, None, 0, False, str(chunk["error"]))
    if first is None:
        return RequestResult(0, None, 0, False, "no token received")
    tpot = (last - first) / (tokens - 1) if tokens > 1 else None
    return RequestResult(first - start, tpot, tokens)


async def run_clients(base: str, prompts, output_len: int, concurrency: int,
                      api_key: str | None) -> LevelResult:
    queue = list(reversed(prompts))
    results: list[RequestResult] = []
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=base, timeout=3600, limits=limits) as http:
        async def client():
            while queue:
                prompt = queue.pop()
                try:
                    results.append(await one_request(http, prompt, output_len, api_key))
                except httpx.HTTPError as exc:
                    results.append(RequestResult(0, None, 0, False, repr(exc)))

        start = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        wall = time.perf_counter() - start
    return LevelResult(concurrency, wall, results)


# ---------------------------------------------------------------- the baseline

def build_engine(engine_args: str):
    from tamis.engine.arg_utils import add_engine_args
    from tamis.engine.config import EngineConfig
    from tamis.engine.engine import LLMEngine

    parser = add_engine_args(argparse.ArgumentParser())
    return LLMEngine(EngineConfig.from_cli_args(parser.parse_args(shlex.split(engine_args))))


def run_offline(engine, prompts, output_len: int, concurrency: int) -> tuple[float, int]:
    """Same requests straight through LLMEngine, N in flight; (wall seconds, tokens)."""
    from tamis.engine.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=output_len, ignore_eos=True, temperature=1.0)
    pending = list(enumerate(prompts))
    in_flight, tokens = 0, 0
    start = time.perf_counter()
    while pending or engine.has_unfinished_requests():
        while pending and in_flight < concurrency:
            i, prompt = pending.pop(0)
            engine.add_request(f"offline-{concurrency}-{i}", prompt, params)
            in_flight += 1
        for output in engine.step():
            if output.finished:
                in_flight -= 1
                tokens += sum(len(c.token_ids) for c in output.outputs)
    return time.perf_counter() - start, tokens


# ---------------------------------------------------------------- report

def report(args, levels: list[LevelResult], offline: dict[int, tuple[float, int]]) -> str:
    lines = [f"W3 serving: {args.num_prompts_per_client} requests per client, prompt "
             f"{args.input_len} random tokens, {args.output_len} output tokens (ignore_eos), "
             f"engine args: `{args.engine_args or '(defaults)'}`", ""]
    lines.append("| clients | ok/sent | req/s | output tok/s | TTFT p50 / p99 (ms) | "
                  "TPOT p50 / p99 (ms) |")
    lines.append("|---|---|---|---|---|---|")
    for level in levels:
        ok = level.ok
        ttft = [r.ttft * 1000 for r in ok]
        tpot = [r.tpot * 1000 for r in ok if r.tpot is not None]
        lines.append(
            f"| {level.concurrency} | {len(ok)}/{len(level.results)} | "
            f"{len(ok) / level.wall:.2f} | {level.output_tokens / level.wall:.1f} | "
            f"{percentile(ttft, 50):.0f} / {percentile(ttft, 99):.0f} | "
            f"{percentile(tpot, 50):.1f} / {percentile(tpot, 99):.1f} |")
    lines += ["", "| workload | ours: tamis serve (tok/s) | baseline: LLMEngine in-process "
              "(tok/s) | ratio |", "|---|---|---|---|"]
    for level in levels:
        ours = level.output_tokens / level.wall
        if level.concurrency in offline:
            wall, tokens = offline[level.concurrency]
            base = tokens / wall
            lines.append(f"| W3 {level.concurrency} clients | {ours:.1f} | {base:.1f} | "
                         f"{ours / base:.2f} |")
        else:
            lines.append(f"| W3 {level.concurrency} clients | {ours:.1f} | (not run) | - |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine-args", default="",
                        help="flags for `tamis serve` and the baseline engine, one string")
    parser.add_argument("--base-url", default=None, help="use a running server instead")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--num-prompts-per-client", type=int, default=2)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--vocab-size", type=int, default=49152)
    parser.add_argument("--no-baseline", action="store_true")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads on both sides (1 on a shared, oversubscribed "
                             "CPU: 2 threads ran 4x slower there)")
    parser.add_argument("--log", default="/tmp/tamis-bench-serve.log")
    args = parser.parse_args(argv)

    proc, base = None, args.base_url
    if base is None:
        proc, base = launch_server(args.engine_args, free_port(), args.log,
                                   max_waiting=max(args.concurrency) * 4,
                                   threads=args.threads)
    levels = []
    warmup = random_prompts(2, args.input_len, args.vocab_size, 999)
    try:
        asyncio.run(run_clients(base, warmup, args.output_len, 2, args.api_key))
        for seed, concurrency in enumerate(args.concurrency):
            prompts = random_prompts(concurrency * args.num_prompts_per_client, args.input_len,
                                     args.vocab_size, seed)
            levels.append(asyncio.run(run_clients(base, prompts, args.output_len, concurrency,
                                                  args.api_key)))
            errors = [r.error for r in levels[-1].results if not r.ok]
            if errors:
                print(f"{len(errors)} failed requests at {concurrency} clients: {errors[:3]}",
                      file=sys.stderr)
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
    offline = {}
    if not args.no_baseline:
        if args.threads is not None:
            import torch
            torch.set_num_threads(args.threads)
        engine = build_engine(args.engine_args)
        run_offline(engine, warmup, args.output_len, 2)
        for seed, concurrency in enumerate(args.concurrency):
            prompts = random_prompts(concurrency * args.num_prompts_per_client, args.input_len,
                                     args.vocab_size, 1000 + seed)
            offline[concurrency] = run_offline(engine, prompts, args.output_len, concurrency)
    print(report(args, levels, offline))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
