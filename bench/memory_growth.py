"""Where allocated GPU memory grows across requests, and whether it keeps growing.

    python bench/memory_growth.py [--rounds 4] [--requests 256] [--out DIR]

tamis on the Llama-3.1-8B shape (dummy bf16 weights) runs ``--rounds`` passes of W1-like
traffic (fresh random prompts of 16-1024 tokens, 8-256 output tokens, EOS ignored) and
prints ``torch.cuda.memory_allocated()`` after a warm-up and after every pass. With the
allocator's history recorded from the warm-up on, every block still allocated at the end
that was allocated after the warm-up is listed with the stack that allocated it, grouped
by stack (the full snapshot goes to DIR/memory_snapshot.pickle, for
https://pytorch.org/memory_viz). A one-time lazy buffer shows as growth in the first pass
only; a leak grows with every pass.
"""
from __future__ import annotations

import argparse
import collections
import os
import pickle
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from llama8b import make_prompts, write_llama8b_config  # noqa: E402


def run_pass(llm, num: int, seed: int, max_tokens: int, lo: int, hi: int) -> None:
    from tamis.engine.sampling_params import SamplingParams
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True,
                            detokenize=False)
    prompts = make_prompts(num, lo, hi, seed)
    llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    torch.cuda.synchronize()


def surviving_blocks(snapshot: dict) -> list[tuple[int, str]]:
    """(size, stack) of every allocated block whose allocation the history recorded."""
    alive = []
    for segment in snapshot["segments"]:
        for block in segment["blocks"]:
            if block["state"] != "active_allocated":
                continue
            frames = block.get("frames") or []
            if not frames:
                continue   # allocated before the history started
            python = [f for f in frames if f["filename"].endswith(".py")
                      and "/torch/" not in f["filename"]][:8]
            stack = " <- ".join(f"{f['filename'].split('/')[-1]}:{f['line']}:{f['name']}"
                                for f in python)
            alive.append((block["size"], stack or frames[0]["filename"]))
    return alive


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--out", default=os.environ.get("OUT", "bench_out"))
    args = parser.parse_args()
    from tamis.engine.llm import LLM
    llm = LLM(model=str(write_llama8b_config(tempfile.mkdtemp())), load_format="dummy",
              dtype="bfloat16", skip_tokenizer_init=True, max_model_len=4096,
              max_num_seqs=256, gpu_memory_utilization=0.9)
    run_pass(llm, 8, args.seed, 16, 16, 64)
    torch.cuda.memory._record_memory_history(max_entries=200_000)
    before = torch.cuda.memory_allocated()
    print(f"after warm-up: {before:,} B allocated")
    shapes = [(256, 128, 1024), (8, 16, 256)]   # W1-like, then many short requests
    for r in range(args.rounds):
        max_tokens, lo, hi = shapes[r % len(shapes)]
        run_pass(llm, args.requests, args.seed + 1 + r, max_tokens, lo, hi)
        now = torch.cuda.memory_allocated()
        print(f"after pass {r + 1} ({args.requests} requests, prompts {lo}-{hi}, "
              f"{max_tokens} out): {now:,} B ({now - before:+,} since the warm-up)", flush=True)
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    with open(Path(args.out) / "memory_snapshot.pickle", "wb") as f:
        pickle.dump(snapshot, f)
    by_stack = collections.Counter()
    count = collections.Counter()
    for size, stack in surviving_blocks(snapshot):
        by_stack[stack] += size
        count[stack] += 1
    print(f"\nblocks allocated after the warm-up and still allocated: "
          f"{sum(count.values())} blocks, {sum(by_stack.values()):,} B")
    for stack, size in by_stack.most_common(12):
        print(f"{size:>12,} B in {count[stack]:>5} blocks: {stack}")
    print(f"stats: {vars(llm.llm_engine.get_stats())}")


if __name__ == "__main__":
    main()
