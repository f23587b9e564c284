"""KV-cache dtype quality: perplexity of the embedded SmolLM2 read through the paged cache.

    python bench/bench_kv_cache_ppl.py [--tokens 8192] [--window 512] [--chunk 128]
                                       [--kv-cache-dtypes auto fp8]
                                       [--fp8-scales unit calculated] [--threads 2]

Text: pydoc_data.topics (ships with Python), the first --tokens tokens, cut into windows of
--window tokens; each window is one request whose prompt logprobs give the NLL of its
tokens. Prefill runs in chunks of --chunk tokens, so most keys and values are read back
from the cache (in its dtype) rather than used straight from the projection. fp32 compute
on the CPU. An fp8 cache runs once per --fp8-scales: ``unit`` (1.0, what a checkpoint without
scales gets) and ``calculated`` (``--calculate-kv-scales``: measured on the first prefill
chunk). Target: fp8 within 0.5% of auto. The last lines are the table.
"""
from __future__ import annotations

import argparse
import math
import time


def evaluation_windows(tokenizer, tokens: int, window: int) -> list[list[int]]:
    from pydoc_data.topics import topics
    text = "\n\n".join(topics[key] for key in sorted(topics))
    ids = tokenizer(text)["input_ids"][:tokens]
    if len(ids) < tokens:
        raise SystemExit(f"pydoc_data.topics has only {len(ids)} tokens")
    return [ids[start:start + window] for start in range(0, tokens, window)
            if tokens - start > 1]


def perplexity(kv_cache_dtype: str, windows: list[list[int]], chunk: int,
               calculate_kv_scales: bool = False) -> float:
    from tamis.engine.llm import LLM
    from tamis.engine.sampling_params import SamplingParams

    llm = LLM(kv_cache_dtype=kv_cache_dtype, calculate_kv_scales=calculate_kv_scales,
              dtype="float32", device="cpu",
              max_model_len=max(map(len, windows)) + 1, max_num_batched_tokens=chunk,
              max_num_seqs=min(chunk, 8), kv_cache_memory_bytes="256MiB")
    params = SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)
    outputs = llm.generate([{"prompt_token_ids": w} for w in windows], params, use_tqdm=False)
    nll, count = 0.0, 0
    for window, out in zip(windows, outputs):
        for position in range(1, len(window)):
            nll -= out.prompt_logprobs[position][window[position]].logprob
            count += 1
    return math.exp(nll / count)


def runs(dtypes: list[str], fp8_scales: list[str]) -> list[tuple[str, str | None]]:
    """(kv-cache dtype, fp8 scales or None) for every run: fp8 dtypes once per scale kind."""
    return [(dtype, scales) for dtype in dtypes
            for scales in (fp8_scales if dtype.startswith("fp8") else [None])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--window", type=int, default=512)
    parser.add_argument("--chunk", type=int, default=128)
    parser.add_argument("--kv-cache-dtypes", nargs="+", default=["auto", "fp8"])
    parser.add_argument("--fp8-scales", nargs="+", default=["unit", "calculated"],
                        choices=["unit", "calculated"])
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    import torch
    from transformers import AutoTokenizer

    from tamis.engine.embedded import default_model_path

    torch.set_num_threads(args.threads)
    windows = evaluation_windows(AutoTokenizer.from_pretrained(default_model_path()),
                                 args.tokens, args.window)
    results = {}
    for dtype, scales in runs(args.kv_cache_dtypes, args.fp8_scales):
        name = f"{dtype} ({scales})" if scales else dtype
        t0 = time.perf_counter()
        results[name] = perplexity(dtype, windows, args.chunk, scales == "calculated")
        print(f"{name}: ppl {results[name]:.4f} ({time.perf_counter() - t0:.0f} s)", flush=True)
    reference = results.get("auto")
    print(f"\nSmolLM2-135M perplexity through the paged KV cache, pydoc_data.topics, "
          f"{args.tokens} tokens, windows of {args.window}, prefill chunks of {args.chunk}")
    print(f"{'kv-cache-dtype':22s} {'ppl':>9s} {'vs auto':>9s}")
    for name, ppl in results.items():
        change = f"{ppl / reference - 1:+.3%}" if reference else "-"
        print(f"{name:22s} {ppl:9.4f} {change:>9s}")


if __name__ == "__main__":
    main()
