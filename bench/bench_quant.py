"""Quantization benchmarks: quality on CPU, GEMM speed on the GPU.

    python bench/bench_quant.py ppl [--tokens 20480] [--window 512] [--methods ...]
        SmolLM2-135M quantized by `tamis quantize` (AWQ 4-bit, GPTQ 4-bit g128 with and
        without act-order, FP8 dynamic), perplexity in tamis on pydoc_data.topics (ships
        with Python) against the unquantized model. Targets: FP8 <= +1%, 4-bit <= +10%.
    python bench/bench_quant.py gemm [--sweep]
        W4A16 (group 128) and FP8 (per-token dynamic) GEMMs at Llama-3.1-8B layer shapes for
        M = 1, 16, 64, 256, 2048 against bf16 F.linear, CUDA events, median of repeats;
        each result is checked against its reference first. --sweep also times a grid of
        W4A16 tile configs and prints the best per shape.
The table comes last: workload, ours, baseline, ratio.
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch

SHAPES = [(4096, 6144), (4096, 4096), (4096, 28672), (14336, 4096)]  # (K, N)
MS = [1, 16, 64, 256, 2048]


# ---------------------------------------------------------------- perplexity (CPU)

def evaluation_ids(tokenizer, tokens: int) -> torch.Tensor:
    from pydoc_data.topics import topics
    text = "\n\n".join(topics[key] for key in sorted(topics))
    ids = tokenizer(text, return_tensors="pt")["input_ids"][0]
    if ids.numel() < tokens:
        raise SystemExit(f"pydoc_data.topics has only {ids.numel()} tokens")
    return ids[:tokens]


@torch.no_grad()
def perplexity(model_dir: Path, ids: torch.Tensor, window: int, quantization=None) -> float:
    from tamis.engine.attention.metadata import forward_context
    from tamis.engine.loader import load_model

    config = SimpleNamespace(model=str(model_dir), dtype="float32", load_format="auto",
                             quantization=quantization, seed=0, attention_backend="torch")
    model, _ = load_model(config, "cpu")
    nll, count = 0.0, 0
    for start in range(0, ids.numel() - 1, window):
        chunk = ids[start:start + window + 1]
        if chunk.numel() < 2:
            break
        inputs, targets = chunk[:-1], chunk[1:]
        with forward_context(None, []):
            logits = model.compute_logits(model(inputs, torch.arange(inputs.numel())))
        nll += torch.nn.functional.cross_entropy(logits, targets, reduction="sum").item()
        count += targets.numel()
    return math.exp(nll / count)


PPL_METHODS = {
    # SmolLM2's K = 576 is not a multiple of 128: AWQ (K % G == 0) takes group 64.
    "awq-4bit-g64": ["--method", "awq", "--group-size", "64"],
    "gptq-4bit-g128": ["--method", "gptq", "--bits", "4", "--group-size", "128"],
    "gptq-4bit-g128-act-order": ["--method", "gptq", "--bits", "4", "--group-size", "128",
                                 "--desc-act"],
    "gptq-4bit-g128-asym": ["--method", "gptq", "--bits", "4", "--group-size", "128", "--no-sym"],
    "gptq-4bit-g128-act-order-asym": ["--method", "gptq", "--bits", "4", "--group-size", "128",
                                      "--desc-act", "--no-sym"],
    "rtn-4bit-g128-asym": ["--method", "gptq", "--bits", "4", "--group-size", "128", "--no-sym",
                           "--rtn"],
    "fp8-dynamic": ["--method", "fp8"],
    "fp8-online": [],  # --quantization fp8 on the unquantized checkpoint (per-channel)
}


def run_ppl(args) -> None:
    """Each figure is stored in WORKDIR/ppl-<name>.json, so several processes can share the
    work (one method each) and a last call prints the table from what is stored."""
    import json

    from transformers import AutoTokenizer

    from tamis.engine.embedded import default_model_path

    torch.set_num_threads(args.threads)
    base = default_model_path()
    ids = evaluation_ids(AutoTokenizer.from_pretrained(base), args.tokens)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="tamis-bench-quant-"))
    work.mkdir(parents=True, exist_ok=True)
    names = ([] if args.no_reference else ["unquantized"]) + list(args.methods)
    for name in names:
        record = work / f"ppl-{name}.json"
        if record.exists():
            continue
        t0 = time.time()
        model_dir, quantization = _ppl_model(name, base, work, args)
        quantize_s = time.time() - t0
        ppl = perplexity(model_dir, ids, args.window, quantization)
        record.write_text(json.dumps({"ppl": ppl, "quantize_s": quantize_s,
                                      "eval_s": time.time() - t0 - quantize_s,
                                      "tokens": int(ids.numel())}))
        print(f"{name}: ppl {ppl:.4f}", flush=True)
    _print_ppl_table(work, ids.numel(), args.window)


def _ppl_model(name: str, base: Path, work: Path, args):
    from tamis.cli import main as tamis_main
    if name == "unquantized":
        return base, None
    if name == "fp8-online":
        return base, "fp8"
    out = work / name
    if not (out / "config.json").exists():
        argv = ["quantize", *PPL_METHODS[name], "--output", str(out),
                "--num-samples", str(args.num_samples), "--seq-len", str(args.seq_len)]
        if tamis_main(argv) != 0:
            raise SystemExit(f"tamis quantize failed for {name}")
    return out, None


def _print_ppl_table(work: Path, tokens: int, window: int) -> None:
    import json
    rows = {p.stem[4:]: json.loads(p.read_text()) for p in sorted(work.glob("ppl-*.json"))}
    reference = rows.get("unquantized", {}).get("ppl")
    print(f"\nperplexity on pydoc_data.topics, {tokens} tokens, windows of {window}")
    print(f"{'model':28s} {'ppl':>9s} {'unquantized':>12s} {'change':>8s} {'quantize s':>11s}")
    for name in ["unquantized", *PPL_METHODS]:
        if name not in rows:
            continue
        ppl = rows[name]["ppl"]
        change = f"{100 * (ppl / reference - 1):+7.2f}%" if reference else "n/a"
        print(f"{name:28s} {ppl:9.4f} {reference or float('nan'):12.4f} {change:>8s} "
              f"{rows[name]['quantize_s']:11.0f}")


# ---------------------------------------------------------------- GEMMs (GPU)

def cuda_time(fn, reps: int = 50, warmup: int = 10) -> float:
    """Median milliseconds of ``fn()`` over ``reps`` CUDA-event timed calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def w4a16_operands(k: int, n: int, group: int = 128):
    from tamis.quant.packing import pack_int32
    codes = torch.randint(0, 16, (k, n), device="cuda")
    qweight = pack_int32(codes, 4, dim=0)
    scales = (torch.rand(k // group, n, device="cuda") * 0.002 + 0.001).half()
    zeros = torch.full((k // group, n), 8.0, device="cuda").half()
    return qweight, scales, zeros


def sweep_configs(m: int):
    from tamis.kernels.w4a16 import GemmConfig
    if m <= 16:
        return [GemmConfig(16, bn, bk, sk, 4, 4) for bn in (32, 64, 128) for bk in (64, 128)
                for sk in (1, 2, 4, 8)]
    return [GemmConfig(bm, bn, 64, 1, w, st) for bm, bn, w in
            ((32, 64, 4), (64, 64, 4), (64, 128, 4), (128, 128, 8), (64, 256, 8), (128, 256, 8))
            for st in (3, 4)]


def run_gemm(args) -> None:
    import torch.nn.functional as F

    from tamis.kernels import fp8, w4a16
    assert torch.cuda.is_available(), "gemm mode needs a CUDA GPU"
    torch.manual_seed(0)
    print(torch.cuda.get_device_name(), "fp8:", fp8.fp8_supported("cuda"), flush=True)
    rows = []
    for k, n in SHAPES:
        weight = (torch.randn(n, k, device="cuda") * 0.02).to(torch.bfloat16)
        qweight, scales, zeros = w4a16_operands(k, n)
        dense_w4 = w4a16.dequantize_wna16(qweight, scales, zeros, 128, 4, k).t().contiguous().to(torch.bfloat16)
        w8, w8_scale = _fp8_weight(weight)
        for m in MS:
            x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            # correctness first
            got = w4a16.w4a16_gemm(x, qweight, scales, zeros, 128)
            ref = F.linear(x, dense_w4)
            err = ((got.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
            assert err < 2e-2, f"W4A16 mismatch at M={m} {k}x{n}: rel err {err}"
            got8 = fp8.fp8_linear(x, w8, w8_scale)
            ref8 = fp8.fp8_linear_ref(x.float(), w8, w8_scale)
            err8 = ((got8.float() - ref8).abs().max() / ref8.abs().max()).item()
            assert err8 < 2e-2, f"FP8 mismatch at M={m} {k}x{n}: rel err {err8}"
            t_bf16 = cuda_time(lambda: F.linear(x, weight))
            t_w4 = cuda_time(lambda: w4a16.w4a16_gemm(x, qweight, scales, zeros, 128))
            t_fp8 = cuda_time(lambda: fp8.fp8_linear(x, w8, w8_scale))
            t_best, best = (_sweep(x, qweight, scales, zeros, m) if args.sweep
                            else (float("nan"), ""))
            rows.append((f"{k}x{n}", m, t_bf16, t_w4, t_fp8, t_best))
            print(f"{k}x{n} M={m}: bf16 {t_bf16 * 1e3:.1f}us w4a16 {t_w4 * 1e3:.1f}us "
                  f"fp8 {t_fp8 * 1e3:.1f}us {best}", flush=True)
    print("\nus per GEMM (median); x = bf16 time / ours; W4A16 best = fastest swept tile config")
    print(f"{'KxN':12s} {'M':>5s} {'bf16':>8s} {'W4A16':>8s} {'x':>6s} {'W4best':>8s} {'x':>6s} "
          f"{'FP8':>8s} {'x':>6s}")
    for shape, m, tb, t4, t8, tbest in rows:
        print(f"{shape:12s} {m:5d} {tb * 1e3:8.1f} {t4 * 1e3:8.1f} {tb / t4:6.2f} "
              f"{tbest * 1e3:8.1f} {tb / tbest:6.2f} {t8 * 1e3:8.1f} {tb / t8:6.2f}")


def _fp8_weight(weight):
    from tamis.quant.fp8 import quantize_weight_per_channel
    return quantize_weight_per_channel(weight)


def _sweep(x, qweight, scales, zeros, m) -> tuple[float, str]:
    from tamis.kernels import w4a16
    results = []
    for config in sweep_configs(m):
        try:
            t = cuda_time(lambda: w4a16.w4a16_gemm_triton(x, qweight, scales, zeros, 128, 4,
                                                          config=config), reps=20, warmup=3)
        except Exception as exc:  # out of shared memory etc.: skip that config
            print(f"  config {config} failed: {type(exc).__name__}", file=sys.stderr)
            continue
        results.append((t, config))
    t, config = min(results, key=lambda r: r[0])
    return t, (f"best {t * 1e3:.1f}us bm={config.block_m} bn={config.block_n} bk={config.block_k} "
            f"sk={config.split_k} w={config.num_warps} st={config.num_stages}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="mode", required=True)
    ppl = sub.add_parser("ppl")
    ppl.add_argument("--tokens", type=int, default=20480)
    ppl.add_argument("--window", type=int, default=512)
    ppl.add_argument("--methods", nargs="+", default=list(PPL_METHODS), choices=list(PPL_METHODS))
    ppl.add_argument("--num-samples", type=int, default=8)
    ppl.add_argument("--seq-len", type=int, default=256)
    ppl.add_argument("--no-reference", action="store_true",
                     help="skip the unquantized model (another process computes it)")
    ppl.add_argument("--threads", type=int, default=2)
    ppl.add_argument("--workdir", default=None, help="keep / reuse quantized checkpoints here")
    gemm = sub.add_parser("gemm")
    gemm.add_argument("--sweep", action="store_true")
    args = parser.parse_args()
    run_ppl(args) if args.mode == "ppl" else run_gemm(args)


if __name__ == "__main__":
    main()
