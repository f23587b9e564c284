"""End-to-end decode speed of quantized Llama-3.1-8B-shape models with dummy weights (GPU).

    python bench/bench_quant_decode.py [--methods bf16 awq gptq-act-order fp8 ...]
                                       [--batch-sizes 1 32] [--output-len 256]
                                       [--engines tamis vllm]

Each method runs in its own process (fresh GPU memory): a Llama-3.1-8B config with that
method's ``quantization_config`` is written to a temporary folder and loaded by tamis
with ``load_format="dummy"`` (``tamis.quant.dummy`` keeps the quantized tensors
consistent), so no checkpoint is needed. For each batch size, ``repeats`` generate calls
on fresh random prompts (a repeated prompt would hit the prefix cache), ``ignore_eos``;
the figure is output tokens per second of the median call (prefill included, CUDA
graphs as the engine uses them). The table comes last: method, batch, tok/s, ms per
step, speed-up over the same engine's bf16.

``--engines tamis vllm`` adds vLLM as the peer (carried to the device as wheels:
``bench/device/carried.sh``): the same config folders, workload and timing, vLLM's
defaults otherwise (it picks its own kernels for each ``quantization_config``: on Hopper
vLLM 0.26 runs AWQ through Machete), one process per engine and method.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llama8b import write_llama8b_config  # noqa: E402
from subprocess_runs import run_each  # noqa: E402

G128 = {"bits": 4, "group_size": 128}
CT_INT4 = {"type": "int", "num_bits": 4, "strategy": "group", "group_size": 128,
           "symmetric": True}
METHODS = {  # name -> (config.json quantization_config, LLM(quantization=...))
    "bf16": (None, None),
    "awq": ({"quant_method": "awq", **G128, "zero_point": True, "version": "gemm"}, None),
    "gptq": ({"quant_method": "gptq", **G128, "desc_act": False}, None),
    "gptq-act-order": ({"quant_method": "gptq", **G128, "desc_act": True}, None),
    "fp8": ({"quant_method": "fp8", "activation_scheme": "dynamic"}, None),
    "fp8-online": (None, "fp8"),
    "ct-w4a16": ({"quant_method": "compressed-tensors", "format": "pack-quantized",
                  "config_groups": {"g": {"targets": ["Linear"], "weights": CT_INT4}},
                  "ignore": ["lm_head"]}, None),
}


def engine_classes(engine: str):
    """(LLM, SamplingParams) of ``engine``: tamis's, or vLLM's (imported only here)."""
    if engine == "vllm":
        os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")   # flashinfer is not carried
        from vllm import LLM, SamplingParams
        return LLM, SamplingParams
    from tamis.engine.llm import LLM
    from tamis.engine.sampling_params import SamplingParams
    return LLM, SamplingParams


def run_method(args) -> dict:
    """In the child: load ``args.method`` in ``args.engine`` and time generate at each
    batch size."""
    import torch

    LLM, SamplingParams = engine_classes(args.engine)
    quant_config, quantization = METHODS[args.method]
    extra = {"quantization_config": quant_config} if quant_config else {}
    model_dir = write_llama8b_config(tempfile.mkdtemp(), **extra)
    t0 = time.perf_counter()
    llm = LLM(model=str(model_dir), load_format="dummy", dtype="bfloat16",
              quantization=quantization, skip_tokenizer_init=True,
              max_model_len=args.max_model_len, max_num_seqs=max(args.batch_sizes),
              gpu_memory_utilization=args.gpu_memory_utilization)
    startup = time.perf_counter() - t0
    rng = random.Random(args.seed)
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    params = SamplingParams(max_tokens=args.output_len, min_tokens=args.output_len,
                            temperature=0.0, ignore_eos=True, detokenize=False)

    def generate(batch: int) -> float:
        prompts = [{"prompt_token_ids": [rng.randrange(args.vocab) for _ in range(args.prompt_len)]}
                   for _ in range(batch)]
        sync()
        start = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        sync()
        return time.perf_counter() - start

    generate(1)   # warm-up (compiles the Triton kernels outside the timings)
    rows = []
    for batch in args.batch_sizes:
        seconds = statistics.median(generate(batch) for _ in range(args.repeats))
        rows.append(dict(batch=batch, seconds=seconds,
                         output_tok_s=batch * args.output_len / seconds))
    return dict(engine=args.engine, method=args.method, startup_s=startup, rows=rows)


def child_name(engine: str, method: str) -> str:
    return method if engine == "tamis" else f"{engine}-{method}"


def parse_child_name(name: str) -> tuple[str, str]:
    if name.startswith("vllm-"):
        return "vllm", name[len("vllm-"):]
    return "tamis", name


def parent(args) -> None:
    names = [child_name(engine, method) for engine in args.engines for method in args.methods]
    results = run_each(__file__, "--child", names, args.out, "decode", "child")
    print_table(results, args)


def print_table(results: list[dict], args) -> None:
    base = {(r.get("engine", "tamis"), row["batch"]): row["output_tok_s"] for r in results
            if r.get("method") == "bf16" for row in r.get("rows", [])}
    print(f"\ndecode, Llama-3.1-8B shape, dummy weights, prompt {args.prompt_len}, "
          f"{args.output_len} output tokens, median of {args.repeats}; x bf16: against the "
          "same engine's bf16")
    print("| engine | method | batch | output tok/s | ms / step | x bf16 |\n"
          "|---|---|---|---|---|---|")
    for r in results:
        if "error" in r:
            engine, method = ((r["engine"], r["method"]) if "engine" in r
                              else parse_child_name(r["child"]))
            print(f"| {engine} | {method} | | failed: {r['error']} | | |")
            continue
        for row in r["rows"]:
            ratio = base.get((r["engine"], row["batch"]))
            ratio = None if ratio is None else row["output_tok_s"] / ratio
            print(f"| {r['engine']} | {r['method']} | {row['batch']} | "
                  f"{row['output_tok_s']:.1f} | {1000 * row['seconds'] / args.output_len:.2f} | "
                  f"{'' if ratio is None else f'{ratio:.2f}'} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--engines", nargs="+", default=["tamis"], choices=["tamis", "vllm"])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vocab", type=int, default=128000, help="prompt token ids drawn below")
    parser.add_argument("--out", default="bench_out")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--json", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is None:
        parent(args)
        return
    args.engine, args.method = parse_child_name(args.child)
    try:
        result = run_method(args)
    except Exception as exc:   # a failed method is a row that says why, not a lost table
        import traceback
        traceback.print_exc()
        result = dict(engine=args.engine, method=args.method,
                      error=f"{type(exc).__name__}: {exc}")
    Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
