"""W0 CPU smoke: tamis vs transformers `generate` on SmolLM2-135M-Instruct, same process.

    python bench/bench_cpu_engine.py [--requests 64] [--max-tokens 64] [--threads 2]

Both engines get the same token-id prompts (mixed lengths), greedy decoding, the same
number of new tokens (EOS ignored, so every request produces exactly --max-tokens), fp32.
transformers runs `generate` on left-padded batches of --hf-batch-size requests (default:
all at once, its fastest setting here). Throughput = generated tokens / time, prefill
included, both by wall clock and by this process's CPU time (on a machine shared with
other jobs the CPU-time figure is the steadier one). The last lines are the table.
"""
from __future__ import annotations

import argparse
import random
import time

import torch

WORDS = ("the of and to in is was for on that with as by at from his her an which their "
         "river mountain engine paper window garden music silver yellow quickly slowly "
         "because however although between within without tomorrow yesterday").split()


def make_prompts(tokenizer, count: int, seed: int = 0) -> list[list[int]]:
    """``count`` prompts of 8..256 tokens from random words (fixed seed)."""
    rng = random.Random(seed)
    prompts = []
    for _ in range(count):
        target = rng.choice([8, 16, 32, 64, 96, 128, 192, 256])
        words = " ".join(rng.choice(WORDS) for _ in range(target * 2))
        prompts.append(tokenizer.encode(words)[:target])
    return prompts


class Timer:
    """Wall and process CPU seconds of a ``with`` block."""

    def __enter__(self):
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        self.wall = time.perf_counter() - self.wall
        self.cpu = time.process_time() - self.cpu


def run_tamis(model_dir, prompts: list[list[int]], max_tokens: int) -> tuple[Timer, list[list[int]]]:
    from tamis import LLM, SamplingParams

    llm = LLM(str(model_dir), device="cpu", max_model_len=1024, kv_cache_memory_bytes="1GiB",
              max_num_seqs=len(prompts))
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    llm.generate(prompts[:2], SamplingParams(temperature=0.0, max_tokens=2), use_tqdm=False)  # warm-up
    with Timer() as timer:
        outputs = llm.generate(prompts, params, use_tqdm=False)
    return timer, [o.outputs[0].token_ids for o in outputs]


def run_transformers(model_dir, prompts: list[list[int]], max_tokens: int,
                     batch_size: int) -> tuple[Timer, list[list[int]]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    pad = 0

    def generate(batch: list[list[int]], new_tokens: int) -> list[list[int]]:
        width = max(len(p) for p in batch)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in batch])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
        with torch.no_grad():
            out = model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens,
                                 min_new_tokens=new_tokens, do_sample=False, pad_token_id=pad)
        return out[:, width:].tolist()

    generate(prompts[:2], 2)   # warm-up
    outputs = []
    with Timer() as timer:
        for i in range(0, len(prompts), batch_size):
            outputs += generate(prompts[i:i + batch_size], max_tokens)
    return timer, outputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--hf-batch-size", type=int, default=None, help="default: all requests")
    parser.add_argument("--model", default=None, help="HF folder (default: the embedded SmolLM2)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from transformers import AutoTokenizer

    from tamis.engine.embedded import default_model_path
    model_dir = args.model or default_model_path()
    prompts = make_prompts(AutoTokenizer.from_pretrained(model_dir), args.requests)
    generated = args.requests * args.max_tokens

    tamis_t, tamis_out = run_tamis(model_dir, prompts, args.max_tokens)
    hf_t, hf_out = run_transformers(model_dir, prompts, args.max_tokens,
                                    args.hf_batch_size or args.requests)
    same = sum(a == b for a, b in zip(tamis_out, hf_out))
    prompt_tokens = sum(len(p) for p in prompts)
    print(f"\n{args.requests} requests, {prompt_tokens} prompt tokens (8..256 each), "
          f"{args.max_tokens} new tokens each, greedy, fp32, {args.threads} threads")
    print(f"identical outputs: {same}/{args.requests} (fp32 rounding differs between padded and "
          f"paged attention, so late tokens may diverge on near-ties)")
    print(f"{'workload':<34} {'tamis tok/s':>12} {'transformers tok/s':>19} {'ratio':>7}")
    for label, ours, theirs in (("W0 CPU SmolLM2 offline (wall)", tamis_t.wall, hf_t.wall),
                                ("W0 CPU SmolLM2 offline (CPU time)", tamis_t.cpu, hf_t.cpu)):
        print(f"{label:<34} {generated / ours:>12.1f} {generated / theirs:>19.1f} {theirs / ours:>7.2f}")


if __name__ == "__main__":
    main()
