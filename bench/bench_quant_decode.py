"""End-to-end decode and prefill speed of quantized Llama-3.1-8B-shape models with dummy
weights (GPU).

    python bench/bench_quant_decode.py [--methods bf16 awq gptq-act-order fp8 ...]
                                       [--batch-sizes 1 32] [--output-len 256]
                                       [--prefill-len 2048] [--engines tamis vllm]
                                       [--w4a16-kernels chosen interleaved canonical]

Each method runs in its own process (fresh GPU memory): a Llama-3.1-8B config with that
method's ``quantization_config`` is written to a temporary folder and loaded by tamis
with ``load_format="dummy"`` (``tamis.quant.dummy`` keeps the quantized tensors
consistent), so no checkpoint is needed. For each batch size, ``repeats`` generate calls
on fresh random prompts (a repeated prompt would hit the prefix cache), ``ignore_eos``;
the figure is output tokens per second of the median call (prefill included, CUDA
graphs as the engine uses them). With ``--prefill-len P`` each batch size also times
calls of one output token on prompts of P tokens (prefill tokens per second). The table
comes last: method, batch, tok/s, ms per step, speed-up over the same engine's bf16.

``--w4a16-kernels`` loads each W4A16 method once per kernel family of
``tamis.quant.wna16_kernels`` (``only_kernels``: "interleaved" the tensor-core
kernels on interleaved words, "canonical" the GEMV / tl.dot / dequantize kernels,
"chosen" what a load picks by itself), so that a family is kept for the shapes and batch
sizes where it wins end to end.

``--engines tamis vllm`` adds vLLM as the peer (installed on the GPU machine from the wheels
``bench/device/make_bundle.py`` collects): the same config folders, workload and timing,
vLLM's defaults otherwise (it picks its own kernels for each ``quantization_config``: on
Hopper vLLM 0.26 runs AWQ through Machete), one process per engine and method.

``--kernel-profile`` runs one more decode pass per batch size under torch's profiler
(``kernel_profile.py``: CUDA kernel time by family and the top kernels against the wall
time), vLLM in-process for it, to say which kernels a gap between the engines comes from.
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
from kernel_profile import format_profile, kernel_profile  # noqa: E402
from llama8b import write_llama8b_config  # noqa: E402
from subprocess_runs import run_each  # noqa: E402

G128 = {"bits": 4, "group_size": 128}
CT_INT4 = {"type": "int", "num_bits": 4, "strategy": "group", "group_size": 128,
           "symmetric": True}
W4A16_METHODS = ("awq", "awq-g32", "gptq", "gptq-act-order", "ct-w4a16")
W4A16_KERNELS = ("chosen", "interleaved", "canonical")
METHODS = {  # name -> (config.json quantization_config, LLM(quantization=...))
    "bf16": (None, None),
    "awq": ({"quant_method": "awq", **G128, "zero_point": True, "version": "gemm"}, None),
    # 32-row groups: the layers the TMA wgmma kernel does not take (the cp.async one does)
    "awq-g32": ({"quant_method": "awq", "bits": 4, "group_size": 32, "zero_point": True,
                 "version": "gemm"}, None),
    # vLLM's GPTQ configs require "sym" (GPTQ's writers always store it).
    "gptq": ({"quant_method": "gptq", **G128, "desc_act": False, "sym": True}, None),
    "gptq-act-order": ({"quant_method": "gptq", **G128, "desc_act": True, "sym": True}, None),
    "fp8": ({"quant_method": "fp8", "activation_scheme": "dynamic"}, None),
    "fp8-online": (None, "fp8"),
    "ct-w4a16": ({"quant_method": "compressed-tensors", "format": "pack-quantized",
                  "config_groups": {"g": {"targets": ["Linear"], "weights": CT_INT4}},
                  "ignore": ["lm_head"]}, None),
}


def engine_classes(engine: str):
    """(LLM, SamplingParams) of ``engine``: tamis's, or vLLM's (imported only here)."""
    if engine == "vllm":
        os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")   # flashinfer is not in the bundle
        from vllm import LLM, SamplingParams
        return LLM, SamplingParams
    from tamis.engine.llm import LLM
    from tamis.engine.sampling_params import SamplingParams
    return LLM, SamplingParams


def load(args):
    """``args.method``'s model in ``args.engine``, W4A16 layers on ``args.kernel``'s
    family; (llm, SamplingParams, seconds to start)."""
    if args.kernel_profile and args.engine == "vllm":    # its kernels in this process's trace
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    LLM, SamplingParams = engine_classes(args.engine)
    quant_config, quantization = METHODS[args.method]
    extra = {"quantization_config": quant_config} if quant_config else {}
    model_dir = write_llama8b_config(tempfile.mkdtemp(), **extra)
    t0 = time.perf_counter()
    with kernel_family(args.kernel):
        llm = LLM(model=str(model_dir), load_format="dummy", dtype="bfloat16",
                  quantization=quantization, skip_tokenizer_init=True,
                  max_model_len=args.max_model_len, max_num_seqs=max(args.batch_sizes),
                  gpu_memory_utilization=args.gpu_memory_utilization)
    return llm, SamplingParams, time.perf_counter() - t0


def kernel_family(name: str):
    """The ``only_kernels`` block of a W4A16 kernel family ("chosen": no constraint)."""
    import contextlib
    if name == "chosen":
        return contextlib.nullcontext()
    from tamis.quant import wna16_kernels
    return wna16_kernels.only_kernels(wna16_kernels.FAMILIES[name])


def run_method(args) -> dict:
    """In the child: load ``args.method`` in ``args.engine`` and time generate at each
    batch size (decode, and prefill with ``--prefill-len``)."""
    import torch

    llm, SamplingParams, startup = load(args)
    rng = random.Random(args.seed)
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)

    def generate(batch: int, prompt_len: int, output_len: int) -> float:
        params = SamplingParams(max_tokens=output_len, min_tokens=output_len, temperature=0.0,
                                ignore_eos=True, detokenize=False)
        prompts = [{"prompt_token_ids": [rng.randrange(args.vocab) for _ in range(prompt_len)]}
                   for _ in range(batch)]
        sync()
        start = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        sync()
        return time.perf_counter() - start

    generate(1, args.prompt_len, args.output_len)   # warm-up (compiles the Triton kernels)
    rows = []
    for batch in args.batch_sizes:
        seconds = statistics.median(generate(batch, args.prompt_len, args.output_len)
                                    for _ in range(args.repeats))
        row = dict(batch=batch, seconds=seconds, output_tok_s=batch * args.output_len / seconds)
        if args.prefill_len:
            prefill = statistics.median(generate(batch, args.prefill_len, 1)
                                        for _ in range(args.repeats))
            row.update(prefill_seconds=prefill, prefill_tok_s=batch * args.prefill_len / prefill)
        if args.kernel_profile:    # one more decode pass, under torch's profiler
            row["kernel_profile"] = {}
            with kernel_profile(row["kernel_profile"]):
                generate(batch, args.prompt_len, args.output_len)
        rows.append(row)
    return dict(engine=args.engine, method=args.method, kernel=args.kernel, startup_s=startup,
                rows=rows)


def child_names(args) -> list[str]:
    """One child per engine, method and (tamis W4A16 methods) kernel family:
    "vllm-awq", "awq", "awq@canonical"."""
    names = []
    for engine in args.engines:
        for method in args.methods:
            kernels = (args.w4a16_kernels if engine == "tamis" and method in W4A16_METHODS
                       else ["chosen"])
            names += [child_name(engine, method, kernel) for kernel in kernels]
    return names


def child_name(engine: str, method: str, kernel: str = "chosen") -> str:
    name = method if engine == "tamis" else f"{engine}-{method}"
    return name if kernel == "chosen" else f"{name}@{kernel}"


def parse_child_name(name: str) -> tuple[str, str, str]:
    """(engine, method, kernel family) of a child's name."""
    name, _, kernel = name.partition("@")
    engine, method = ("vllm", name[len("vllm-"):]) if name.startswith("vllm-") else ("tamis", name)
    return engine, method, kernel or "chosen"


def parent(args) -> None:
    results = run_each(__file__, "--child", child_names(args), args.out, "decode", "child")
    print_table(results, args)
    print_act_order_cost(results)
    for r in results:
        for row in r.get("rows", []):
            if row.get("kernel_profile"):
                print(format_profile(f"{r['engine']} {r['method']} batch {row['batch']}",
                                     row["kernel_profile"]))


def print_act_order_cost(results: list[dict]) -> None:
    """gptq-act-order's decode speed over gptq's, per engine and batch (issue: act-order
    within 3% of the same checkpoint without it)."""
    speed = {(r["engine"], r["method"], row["batch"]): row["output_tok_s"] for r in results
             if "error" not in r and r.get("kernel", "chosen") == "chosen" for row in r["rows"]}
    for (engine, method, batch), tok_s in sorted(speed.items()):
        plain = speed.get((engine, "gptq", batch))
        if method == "gptq-act-order" and plain:
            print(f"{engine} batch {batch}: gptq-act-order / gptq = {tok_s / plain:.3f}")


def print_table(results: list[dict], args) -> None:
    base = {(r.get("engine", "tamis"), row["batch"]): row["output_tok_s"] for r in results
            if r.get("method") == "bf16" for row in r.get("rows", [])}
    print(f"\ndecode, Llama-3.1-8B shape, dummy weights, prompt {args.prompt_len}, "
          f"{args.output_len} output tokens, median of {args.repeats}; x bf16: against the "
          "same engine's bf16; prefill: one output token on prompts of "
          f"{args.prefill_len or '-'} tokens")
    print("| engine | method | W4A16 kernel | batch | output tok/s | ms / step | x bf16 "
          "| prefill tok/s |\n|---|---|---|---|---|---|---|---|")
    for r in results:
        if "error" in r:
            engine, method, kernel = parse_child_name(r["child"]) if "child" in r else (
                r["engine"], r["method"], r.get("kernel", "chosen"))
            print(f"| {engine} | {method} | {kernel} | | failed: {r['error']} | | | |")
            continue
        for row in r["rows"]:
            ratio = base.get((r["engine"], row["batch"]))
            ratio = None if ratio is None else row["output_tok_s"] / ratio
            prefill = row.get("prefill_tok_s")
            print(f"| {r['engine']} | {r['method']} | {r.get('kernel', 'chosen')} | "
                  f"{row['batch']} | {row['output_tok_s']:.1f} | "
                  f"{1000 * row['seconds'] / args.output_len:.2f} | "
                  f"{'' if ratio is None else f'{ratio:.2f}'} | "
                  f"{'' if prefill is None else f'{prefill:.0f}'} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--engines", nargs="+", default=["tamis"], choices=["tamis", "vllm"])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--prefill-len", type=int, default=0,
                        help="also time one-token calls on prompts of this many tokens")
    parser.add_argument("--w4a16-kernels", nargs="+", default=["chosen"], choices=W4A16_KERNELS,
                        help="W4A16 kernel families to load each W4A16 method with")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--kernel-profile", action="store_true",
                        help="time one more decode pass per batch size under torch's profiler "
                             "(CUDA kernels by family; vLLM runs in-process for it)")
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
    args.engine, args.method, args.kernel = parse_child_name(args.child)
    try:
        result = run_method(args)
    except Exception as exc:   # a failed method is a row that says why, not a lost table
        import traceback
        traceback.print_exc()
        result = dict(engine=args.engine, method=args.method, kernel=args.kernel,
                      error=f"{type(exc).__name__}: {exc}")
    Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
