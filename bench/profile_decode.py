"""Where a W2 decode step's time goes on the GPU: the CUDA kernels of batch-1 decode at
Llama-3.1-8B shape (dummy bf16 weights), from the torch profiler.

    python3 -P bench/profile_decode.py [--enforce-eager] [--tokens 64] [--top 25]

Runs W2's request (128-token random prompt, greedy, EOS ignored) once to warm up, times
256 output tokens (W2's figure, median of ``--repeats``), then profiles ``--tokens`` more
and prints, per kernel name, calls and GPU microseconds per decode step, with the step's
wall time beside the summed kernel time (the difference is launch gaps and host work the
GPU waits for).
With CUDA graphs on (the default), kernels replayed from a graph are listed when the
profiler's CUPTI records graph nodes (torch >= 2.1 with CUDA 12).
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from llama8b import write_llama8b_config  # noqa: E402


def generate(llm, prompt: list[int], tokens: int) -> None:
    from tamis.engine.sampling_params import SamplingParams
    params = SamplingParams(max_tokens=tokens, ignore_eos=True, temperature=0.0,
                            detokenize=False)
    llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)


def w2_rate(llm, prompt: list[int]) -> float:
    """Output tokens per second of W2's request (256 tokens, prefill included)."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    generate(llm, prompt, 256)
    torch.cuda.synchronize()
    return 256 / (time.perf_counter() - t0)


def kernel_table(prof, steps: int) -> list[tuple[str, int, float]]:
    """(kernel name, calls per step, GPU us per step), largest first."""
    calls, micros = defaultdict(int), defaultdict(float)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            calls[event.name] += 1
            micros[event.name] += event.device_time
    rows = [(name, calls[name] / steps, micros[name] / steps) for name in micros]
    return sorted(rows, key=lambda row: -row[2])


def main() -> None:
    from tamis.engine.llm import LLM
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--repeats", type=int, default=3, help="W2 runs (median)")
    args = parser.parse_args()
    folder = write_llama8b_config(tempfile.mkdtemp(prefix="profile_decode_"))
    llm = LLM(model=str(folder), load_format="dummy", dtype="bfloat16", skip_tokenizer_init=True,
              max_model_len=4096, max_num_seqs=256, gpu_memory_utilization=0.6,
              enforce_eager=args.enforce_eager)
    prompt = [random.Random(0).randrange(128000) for _ in range(128)]
    generate(llm, prompt, 32)
    w2 = statistics.median(w2_rate(llm, prompt) for _ in range(args.repeats))
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        t0 = time.perf_counter()
        generate(llm, prompt, args.tokens)
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    rows = kernel_table(prof, args.tokens)
    print(f"W2 (256 tokens, unprofiled, median of {args.repeats}): {w2:.1f} tok/s, "
          f"{1e3 / w2:.2f} ms per token")
    print(f"profiled {args.tokens} tokens: wall {wall / args.tokens * 1e3:.2f} ms per token, "
          f"kernels {sum(r[2] for r in rows) / 1e3:.2f} ms per token "
          f"({'eager' if args.enforce_eager else 'CUDA graphs'})")
    print(f"{'us/step':>9s} {'calls/step':>10s}  kernel")
    for name, per_step, micros in rows[:args.top]:
        print(f"{micros:9.1f} {per_step:10.1f}  {name[:110]}")


if __name__ == "__main__":
    main()
