"""W1 offline throughput on the GPU: tamis against transformers on the same workload, one call.

Workload (W1 of bench/RESULTS.md): 256 requests, prompts of 128-1024 random token ids (fresh
each run, the same for every engine), 256 output tokens each, EOS ignored, greedy,
dummy bf16 weights at the ``--shape`` (bench/shapes.py; default Llama-3.1-8B).

    python bench/bench_offline.py [--engines tamis,transformers] [--num-prompts 256]
    python bench/bench_offline.py --engines tamis,vllm --shape qwen3-30b-a3b
    python bench/bench_offline.py --engines tamis,vllm --shape mixtral-8x7b --quantization fp8

``--quantization`` goes to tamis and vLLM alike (``fp8``: online FP8 of the bf16 weights);
transformers has no such run and is refused with it. The recorded peer figures are the
Llama-3.1-8B shape's and are shown for it only.

Each engine runs in its own subprocess (clean GPU memory, its own warm-up) and writes
JSON; the parent prints the table last. ``--engines tamis,vllm`` runs vLLM (installed beside
tamis from wheels) on the same prompts through bench_vllm.py, which also times vLLM's W2 in
the same process; a peer that was not run shows the figure recorded on an H200,
labelled as recorded, not measured.

``--kv-cache-dtype fp8`` runs tamis with an FP8 (e4m3) KV cache; ``--kv-cache-memory 8GiB``
caps tamis's KV cache (else it takes what --gpu-memory-utilization 0.9 leaves). Under a cap
small enough that a bf16 cache preempts, run the pair with the same --seed::

    python bench/bench_offline.py --engines tamis --kv-cache-memory 8GiB --seed 1 --out o/auto
    python bench/bench_offline.py --engines tamis --kv-cache-memory 8GiB --seed 1 \
        --kv-cache-dtype fp8 --out o/fp8

the tamis row names its KV dtype, cap and preemption count.

Extra checks in the tamis subprocess (``--checks``): allocated bytes before/after a
second full pass (memory growth) and KV utilisation from the engine's stats.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from llama8b import add_w1_workload_args, make_prompts  # noqa: E402
from shapes import (DEFAULT_SHAPE, add_shape_args, describe, prompt_vocab,  # noqa: E402
                    write_shape_config)
from kernel_profile import format_profile, kernel_profile  # noqa: E402
from subprocess_runs import run_each  # noqa: E402

RECORDED_PEERS = {"transformers": 496.0, "vllm": 9355.0}   # measured once on an H200


class StepProfiler:
    """Wall time of each phase of every engine step, split by decode-only (graph) and
    mixed steps. Forward and logits are followed by a sync so GPU time lands in them;
    the step syncs anyway when the sampler reads the sampled ids."""

    PHASES = ("schedule", "prepare_inputs", "forward", "compute_logits", "sample")

    def __init__(self, engine):
        import torch
        self.steps: list[dict] = []
        self.current: dict = {}
        runner = engine.runner
        self._wrap(engine.scheduler, "schedule", None)
        self._wrap(runner, "prepare_inputs", None)
        self._wrap(runner, "forward", torch.cuda.synchronize)
        self._wrap(runner, "compute_logits", torch.cuda.synchronize)
        self._wrap(runner, "sample", None)
        step = engine.step

        def timed_step():
            self.current = {}
            t0 = time.perf_counter()
            out = step()
            self.current["step"] = time.perf_counter() - t0
            if "forward" in self.current:
                self.steps.append(self.current)
            return out
        engine.step = timed_step

    def _wrap(self, obj, name, sync):
        inner = getattr(obj, name)

        def timed(*a, **k):
            t0 = time.perf_counter()
            out = inner(*a, **k)
            if sync is not None:
                sync()
            self.current[name] = self.current.get(name, 0.0) + time.perf_counter() - t0
            if name == "prepare_inputs":
                self.current["graph"] = getattr(out, "graph_size", None) is not None
                self.current["tokens"] = int(out.input_ids.shape[0])
            return out
        setattr(obj, name, timed)

    def summary(self) -> dict:
        out = {}
        for kind, steps in (("decode_graph", [s for s in self.steps if s.get("graph")]),
                            ("eager", [s for s in self.steps if not s.get("graph")])):
            if not steps:
                continue
            row = {"steps": len(steps), "total_s": round(sum(s["step"] for s in steps), 3)}
            for phase in self.PHASES + ("step",):
                row[f"{phase}_ms"] = round(1e3 * sum(s.get(phase, 0.0) for s in steps)
                                           / len(steps), 3)
            row["other_ms"] = round(row["step_ms"] - sum(row[f"{p}_ms"] for p in self.PHASES), 3)
            row["mean_tokens"] = round(sum(s["tokens"] for s in steps) / len(steps), 1)
            out[kind] = row
        return out


def run_tamis(args, prompts) -> dict:
    from tamis.engine.llm import LLM
    from tamis.engine.sampling_params import SamplingParams
    import torch
    model_dir = write_shape_config(args.shape, tempfile.mkdtemp())
    t0 = time.perf_counter()
    llm = LLM(model=str(model_dir), load_format="dummy", dtype="bfloat16",
              quantization=args.quantization, skip_tokenizer_init=True,
              max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
              gpu_memory_utilization=0.9,
              enforce_eager=args.enforce_eager, kv_cache_dtype=args.kv_cache_dtype,
              kv_cache_memory_bytes=args.kv_cache_memory)
    startup = time.perf_counter() - t0
    params = SamplingParams(max_tokens=args.output_len, temperature=0.0, ignore_eos=True,
                            detokenize=False)
    vocab = prompt_vocab(args.shape)
    warm = make_prompts(8, 16, 64, args.seed + 1, vocab)
    llm.generate([{"prompt_token_ids": p} for p in warm], params, use_tqdm=False)
    torch.cuda.synchronize()
    allocated_before = torch.cuda.memory_allocated()
    t0 = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    elapsed = time.perf_counter() - t0
    profile = None
    if args.step_profile:   # a second pass on fresh prompts, instrumented
        profiler = StepProfiler(llm.llm_engine)
        again = make_prompts(args.num_prompts, args.min_prompt, args.max_prompt, args.seed + 7,
                             vocab)
        t1 = time.perf_counter()
        llm.generate([{"prompt_token_ids": p} for p in again], params, use_tqdm=False)
        profile = dict(profiled_seconds=time.perf_counter() - t1, **profiler.summary())
        llm.llm_engine.step = type(llm.llm_engine).step.__get__(llm.llm_engine)
    kernels = None
    if args.kernel_profile:   # another pass on fresh prompts, under torch's profiler
        kernels = {}
        again = make_prompts(args.num_prompts, args.min_prompt, args.max_prompt, args.seed + 9,
                             vocab)
        with kernel_profile(kernels):
            llm.generate([{"prompt_token_ids": p} for p in again], params, use_tqdm=False)
    generated = sum(len(o.outputs[0].token_ids) for o in outs)
    stats = llm.llm_engine.get_stats()
    result = dict(engine="tamis", shape=args.shape, quantization=args.quantization,
                  kv_cache=dict(dtype=args.kv_cache_dtype, cap=args.kv_cache_memory,
                                blocks=stats.num_total_blocks,
                                preemptions=stats.num_preemptions),
                  seconds=elapsed, output_tokens=generated,
                  output_tok_s=generated / elapsed, startup_s=startup,
                  total_tok_s=(generated + sum(map(len, prompts))) / elapsed, profile=profile,
                  kernel_profile=kernels)
    if args.checks:
        result.update(memory_check(llm, params, args, allocated_before))
    return result


def memory_check(llm, params, args, allocated_before: int) -> dict:
    """Allocated bytes after more fresh requests against before the first pass."""
    import torch
    rounds = args.memory_rounds
    for r in range(rounds):
        batch = make_prompts(args.num_prompts, 16, 256, args.seed + 100 + r,
                             prompt_vocab(args.shape))
        short = type(params)(max_tokens=8, temperature=0.0, ignore_eos=True, detokenize=False)
        llm.generate([{"prompt_token_ids": p} for p in batch], short, use_tqdm=False)
    torch.cuda.synchronize()
    stats = llm.llm_engine.get_stats()
    return dict(memory_requests=rounds * args.num_prompts + args.num_prompts,
                allocated_before=allocated_before, allocated_after=torch.cuda.memory_allocated(),
                kv_stats={k: v for k, v in vars(stats).items() if not k.startswith("_")})


def run_transformers(args, prompts) -> dict:
    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig
    model_dir = write_shape_config(args.shape, tempfile.mkdtemp(), eos_token_id=None)
    config = AutoConfig.from_pretrained(model_dir)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16,
                                                 attn_implementation="sdpa").eval()
    gen = GenerationConfig(max_new_tokens=args.output_len, do_sample=False, eos_token_id=None,
                           pad_token_id=0)
    subset = prompts[:args.hf_num_prompts] if args.hf_num_prompts else prompts
    t0 = time.perf_counter()
    outs = model.generate_batch(inputs=subset, generation_config=gen)
    elapsed = time.perf_counter() - t0
    generated = sum(len(o.generated_tokens) for o in outs.values())
    label = f"transformers {transformers.__version__} generate_batch"
    if len(subset) < len(prompts):
        label += f" (first {len(subset)} of the {len(prompts)} requests only)"
    return dict(engine=label, seconds=elapsed, output_tokens=generated,
                output_tok_s=generated / elapsed)


def run_vllm(args, prompts) -> dict:
    from bench_vllm import run_all
    return run_all(args, prompts)


def child(args) -> None:
    import logging
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    prompts = make_prompts(args.num_prompts, args.min_prompt, args.max_prompt, args.seed,
                           prompt_vocab(args.shape))
    runner = {"tamis": run_tamis, "transformers": run_transformers, "vllm": run_vllm}[args.engine]
    try:
        result = runner(args, prompts)
    except Exception as exc:   # a failed engine is a row that says why, not a lost table
        import traceback
        traceback.print_exc()
        result = dict(engine=args.engine, error=f"{type(exc).__name__}: {exc}")
    Path(args.json).write_text(json.dumps(result, indent=1, default=str))


def parent(args) -> None:
    rows = run_each(__file__, "--engine", args.engines.split(","), args.out, "w1", "engine")
    print_table(rows, args)


def print_table(rows: list[dict], args) -> None:
    tamis = next((r for r in rows if r["engine"] == "tamis" and "error" not in r), None)
    print(f"\nW1 offline: {args.num_prompts} requests, prompts {args.min_prompt}-{args.max_prompt} "
          f"random tokens, {args.output_len} output tokens, "
          f"{describe(args.shape, args.quantization)}")
    print("| engine | output tok/s | seconds | tamis / this |\n|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['engine']} | failed: {r['error'][:120]} | | |")
            continue
        ratio = f"{tamis['output_tok_s'] / r['output_tok_s']:.2f}" if tamis else ""
        print(f"| {r['engine']} (measured) | {r['output_tok_s']:,.0f} | {r['seconds']:.1f} | {ratio} |")
    measured = {r["engine"].split()[0] for r in rows if "error" not in r}
    recorded = RECORDED_PEERS if (args.shape, args.quantization) == (DEFAULT_SHAPE, None) else {}
    for name, figure in recorded.items():
        if name in measured:
            continue
        ratio = f"{tamis['output_tok_s'] / figure:.2f}" if tamis else ""
        print(f"| {name} (RECORDED on an H200, not measured here) | {figure:,.0f} | | {ratio} |")
    for r in rows:
        if "w2" in r:
            print(f"{r['engine']} W2 (batch 1, prompt 128, 256 out, median of 3): "
                  f"{r['w2']['output_tok_s']:.1f} tok/s; startup {r['startup_s']:.0f} s")
    if tamis and tamis.get("profile"):
        print(f"\nstep profile (second pass, instrumented): {json.dumps(tamis['profile'])}")
    for r in rows:
        if r.get("kernel_profile"):
            print(format_profile(r["engine"], r["kernel_profile"]))
    if tamis:
        print(f"tamis startup {tamis['startup_s']:.1f} s; KV cache {tamis['kv_cache']}")
    if tamis and "allocated_after" in tamis:
        grow = tamis["allocated_after"] - tamis["allocated_before"]
        print(f"\nmemory: allocated {tamis['allocated_before']:,} B before, "
              f"{tamis['allocated_after']:,} B after {tamis['memory_requests']} more requests "
              f"(growth {grow:,} B); stats {tamis['kv_stats']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--engines", default="tamis,transformers")
    parser.add_argument("--engine", help=argparse.SUPPRESS)
    parser.add_argument("--json", help=argparse.SUPPRESS)
    add_w1_workload_args(parser)
    add_shape_args(parser)
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--hf-num-prompts", type=int, default=0,
                        help="transformers runs only the first N requests (0: all); "
                             "saves device time, and its row says so")
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument("--kv-cache-dtype", default="auto", help="tamis's KV cache (auto, fp8, ...)")
    parser.add_argument("--kv-cache-memory", default=None,
                        help="cap on tamis's KV cache, e.g. 4GiB (default: profiled)")
    parser.add_argument("--checks", action="store_true", help="memory growth and KV stats")
    parser.add_argument("--step-profile", action="store_true",
                        help="a second, instrumented pass: time per step phase")
    parser.add_argument("--kernel-profile", action="store_true",
                        help="another pass under torch's profiler: CUDA kernel time by "
                             "family against wall time (vLLM runs in-process for it)")
    parser.add_argument("--memory-rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--out", default=os.environ.get("OUT", "bench_out"))
    args = parser.parse_args()
    if args.quantization and "transformers" in (args.engine or args.engines).split(","):
        parser.error("--quantization applies to tamis and vLLM; run transformers without it")
    if args.engine:
        child(args)
    else:
        if "--seed" not in sys.argv:   # every child gets the same fresh prompts
            sys.argv += ["--seed", str(args.seed)]
        parent(args)


if __name__ == "__main__":
    main()
