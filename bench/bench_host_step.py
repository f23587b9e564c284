"""The engine's host work per decode step, on the CPU: what a GPU step must hide.

    python bench/bench_host_step.py [--batch 256] [--steps 60] [--threads 1]

A tiny random Llama (the tests' ``tiny_models``, SmolLM2's tokenizer) decodes ``--batch``
requests of 128 prompt tokens with sampling, EOS ignored, outputs kept to the end (as
``LLM.generate`` keeps them). Timed per step, wall clock, median over the steps after
the first ten: the scheduler (``schedule``), the step's end (``_finish_step``: appending
each token, stop checks, incremental detokenization, outputs) and the GPU runner's host
layout (``build_host_batch``, numpy) of the same batches. The forward pass and sampling
are left out: on a GPU they run on the device while the host does the rest.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from call_timing import time_calls  # noqa: E402
from tiny_models import make_tiny_checkpoint  # noqa: E402

from tamis import SamplingParams  # noqa: E402
from tamis.engine.engine import LLMEngine  # noqa: E402
from tamis.engine.host_batch import BlockTableRows, build_host_batch  # noqa: E402
from tamis.engine.sampling_params import RequestOutputKind  # noqa: E402

PROMPT_LEN = 128
WARMUP_STEPS = 10


def run(model: Path, batch: int, steps: int) -> dict[str, float]:
    engine = LLMEngine(model=str(model), dtype="float32", max_model_len=1024,
                       max_num_seqs=batch, kv_cache_memory_bytes="512MiB", device="cpu")
    params = SamplingParams(temperature=1.0, max_tokens=steps + 16, ignore_eos=True,
                            output_kind=RequestOutputKind.FINAL_ONLY)
    for i in range(batch):
        engine.add_request(str(i), [100 + (i + j) % 4000 for j in range(PROMPT_LEN)], params)
    while engine.scheduler.waiting:   # prefill first: only decode steps are timed
        engine.step()
    times = {"schedule": [], "finish": []}
    time_calls(engine.scheduler, "schedule", times["schedule"].append)
    time_calls(engine, "_finish_step", times["finish"].append)
    batches = []
    execute = engine.runner.execute_model
    engine.runner.execute_model = lambda b, *a, **k: (batches.append(b), execute(b, *a, **k))[1]
    for _ in range(steps):
        engine.step()
    rows, layout = BlockTableRows(batch, 1024 // 16), []
    for scheduled in batches:
        start = time.perf_counter()
        build_host_batch(scheduled, 16, None, rows, [])
        layout.append(time.perf_counter() - start)
    times["host layout"] = layout
    return {name: statistics.median(values[WARMUP_STEPS:]) * 1e3
            for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    if args.steps <= WARMUP_STEPS:
        parser.error(f"--steps must exceed the {WARMUP_STEPS} untimed steps")
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as folder:
        model = make_tiny_checkpoint("llama", Path(folder) / "tiny")
        medians = run(model, args.batch, args.steps)
    print(f"\n| host work per decode step, batch {args.batch} | ms (median) |\n|---|---|")
    for name, ms in medians.items():
        print(f"| {name} | {ms:.2f} |")


if __name__ == "__main__":
    main()
