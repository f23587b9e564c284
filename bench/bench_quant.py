"""Quantization benchmarks: quality on CPU, GEMM speed on the GPU.

    python bench/bench_quant.py ppl [--tokens 20480] [--window 512] [--methods ...]
        SmolLM2-135M quantized by `tamis quantize` (AWQ 4-bit, GPTQ 4-bit g128 with and
        without act-order, FP8 dynamic), perplexity in tamis on pydoc_data.topics (ships
        with Python) against the unquantized model. Targets: FP8 <= +1%, 4-bit <= +10%.
    python bench/bench_quant.py gemm [--kernel FAMILY] [--eager] [--ms 1 4 16 ...] [--rotate N]
        W4A16 (group 128; a bf16 layer whose kernel is chosen as at load, or forced with
        --kernel interleaved | canonical | reference) and FP8 (per-channel weights; W8A16
        GEMV for M <= 4, per-token dynamic W8A8 above) GEMMs at Llama-3.1-8B layer shapes
        for M = 1, 4, 16, 64, 256, 2048 against bf16 F.linear, timed by CUDA-graph replay
        (--eager: CUDA events on eager calls), median of repeats; each result is checked
        against its reference first. --rotate N cycles the timed calls through N
        copies of each weight (weights that fit in the L2 cache are otherwise re-read from
        it). --pdl MODE ...
        times the W4A16 / FP8 kernels under each launch mode of tamis.kernels.pdl (default
        auto, the engine's; in a graph of back-to-back calls a kernel launched with PDL
        overlaps the one before, as a model's layers do) and adds a table by mode.
The table comes last: workload, ours, baseline, ratio.
"""
from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch

SHAPES = [(4096, 6144), (4096, 4096), (4096, 28672), (14336, 4096)]  # (K, N)
MS = [1, 2, 4, 16, 64, 256, 2048]


# ---------------------------------------------------------------- perplexity (CPU)

def parse_shapes(texts: list[str] | None) -> list[tuple[int, int]]:
    """``--shapes`` values ("KxN") as (K, N) pairs; none given: the four ``SHAPES``."""
    return [tuple(int(v) for v in t.split("x")) for t in texts] if texts else SHAPES


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


_GPTQ = ["--method", "gptq", "--bits", "4", "--group-size", "128"]
_AWQ = ["--method", "awq", "--group-size", "64"]
PPL_METHODS = {
    # SmolLM2's K = 576 is not a multiple of 128: AWQ (K % G == 0) takes group 64.
    "awq-4bit-g64": _AWQ,
    "gptq-4bit-g128": _GPTQ,
    "gptq-4bit-g128-act-order": [*_GPTQ, "--desc-act"],
    "gptq-4bit-g128-asym": [*_GPTQ, "--no-sym"],
    "gptq-4bit-g128-act-order-asym": [*_GPTQ, "--desc-act", "--no-sym"],
    "rtn-4bit-g128-asym": [*_GPTQ, "--no-sym", "--rtn"],
    "fp8-dynamic": ["--method", "fp8"],  # GPTQ-rounded FP8 weights, per-channel scales
    "fp8-dynamic-rtn": ["--method", "fp8", "--rtn"],
    "fp8-online": [],  # --quantization fp8 on the unquantized checkpoint (per-channel)
    # The residual stream rotated before quantizing (quant/quantizer/rotate.py): the
    # default of calibrated GPTQ (the four gptq rows above), opt-in elsewhere.
    "gptq-4bit-g128-no-rotate": [*_GPTQ, "--no-rotate"],
    "gptq-4bit-g128-act-order-no-rotate": [*_GPTQ, "--desc-act", "--no-rotate"],
    "gptq-4bit-g128-asym-no-rotate": [*_GPTQ, "--no-sym", "--no-rotate"],
    "gptq-4bit-g128-act-order-asym-no-rotate": [*_GPTQ, "--desc-act", "--no-sym", "--no-rotate"],
    "awq-4bit-g64-rotate": [*_AWQ, "--rotate"],
    "rtn-4bit-g128-rotate": [*_GPTQ, "--rtn", "--rotate"],
    "rtn-4bit-g128": [*_GPTQ, "--rtn"],
    "fp8-dynamic-rotate": ["--method", "fp8", "--rotate"],
    # The quantizer's options one at a time against the defaults (pipeline.DEFAULTS);
    # "-plain": every option off (tamis quantize before issue 5's quality push).
    "gptq-4bit-g128-plain": [*_GPTQ, "--no-output-clip", "--no-static-groups", "--refine", "0"],
    "gptq-4bit-g128-no-output-clip": [*_GPTQ, "--no-output-clip"],
    "gptq-4bit-g128-no-static-groups": [*_GPTQ, "--no-static-groups"],
    "gptq-4bit-g128-no-refine": [*_GPTQ, "--refine", "0"],
    "gptq-4bit-g128-refine3": [*_GPTQ, "--refine", "3"],
    "gptq-4bit-g128-descent": [*_GPTQ, "--descent", "2"],
    "gptq-4bit-g128-true-sequential": [*_GPTQ, "--true-sequential"],
    "gptq-4bit-g128-damp0.1": [*_GPTQ, "--damp", "0.1"],
    "gptq-4bit-g128-act-order-static": [*_GPTQ, "--desc-act", "--static-groups"],
    "gptq-4bit-g128-act-order-static-asym": [*_GPTQ, "--desc-act", "--static-groups", "--no-sym"],
    # Rows measured before --desc-act defaulted to runs of 32 + refine 1 pin what they
    # measured: "--act-order-block 1" (per column) or "--refine 0".
    "gptq-4bit-g128-act-order-asym-refine1": [*_GPTQ, "--desc-act", "--no-sym",
                                              "--act-order-block", "1", "--refine", "1"],
    "gptq-4bit-g128-act-order-asym-refit": [*_GPTQ, "--desc-act", "--no-sym",
                                            "--act-order-block", "1", "--refit"],
    "gptq-4bit-g128-act-order-asym-b32-refit": [*_GPTQ, "--desc-act", "--no-sym",
                                                "--act-order-block", "32", "--refine", "0",
                                                "--refit"],
    "gptq-4bit-g128-act-order-asym-b32-refine1": [*_GPTQ, "--desc-act", "--no-sym",
                                                  "--act-order-block", "32", "--refine", "1"],
    "gptq-4bit-g128-act-order-asym-b16-refine1": [*_GPTQ, "--desc-act", "--no-sym",
                                                  "--act-order-block", "16", "--refine", "1"],
    "gptq-4bit-g128-act-order-asym-b64-refine1": [*_GPTQ, "--desc-act", "--no-sym",
                                                  "--act-order-block", "64", "--refine", "1"],
    "gptq-4bit-g128-act-order-asym-b32-prefit": [*_GPTQ, "--desc-act", "--no-sym",
                                                 "--act-order-block", "32", "--prefit-grids",
                                                 "--refine", "0"],
    "gptq-4bit-g128-act-order-asym-b32-prefit-refine1": [
        *_GPTQ, "--desc-act", "--no-sym", "--act-order-block", "32", "--prefit-grids",
        "--refine", "1"],
    "gptq-4bit-g128-act-order-b32-refine1": [*_GPTQ, "--desc-act", "--act-order-block", "32",
                                             "--refine", "1"],
    # GPTQ's per-column act order (the asym --desc-act default before runs of 32 + refine 1;
    # still the symmetric default).
    "gptq-4bit-g128-act-order-b1": [*_GPTQ, "--desc-act", "--act-order-block", "1"],
    "gptq-4bit-g128-act-order-asym-b1": [*_GPTQ, "--desc-act", "--no-sym",
                                         "--act-order-block", "1"],
    "gptq-4bit-g128-act-order-asym-damp0.1": [*_GPTQ, "--desc-act", "--no-sym", "--damp", "0.1",
                                              "--act-order-block", "1"],
    "gptq-4bit-g128-act-order-b32": [*_GPTQ, "--desc-act", "--act-order-block", "32",
                                     "--refine", "0"],
    "gptq-4bit-g128-act-order-asym-b32": [*_GPTQ, "--desc-act", "--no-sym",
                                          "--act-order-block", "32", "--refine", "0"],
    "gptq-4bit-g128-act-order-b64": [*_GPTQ, "--desc-act", "--act-order-block", "64",
                                     "--refine", "0"],
    "gptq-4bit-g128-act-order-asym-b64": [*_GPTQ, "--desc-act", "--no-sym",
                                          "--act-order-block", "64", "--refine", "0"],
    "gptq-4bit-g128-act-order-asym-b32-awq": [*_GPTQ, "--desc-act", "--no-sym",
                                              "--act-order-block", "32", "--refine", "0",
                                              "--awq-scales"],
    "gptq-4bit-g128-act-order-asym-awq": [*_GPTQ, "--desc-act", "--no-sym", "--awq-scales",
                                          "--act-order-block", "1"],
    "gptq-4bit-g128-awq": [*_GPTQ, "--awq-scales"],
    "gptq-4bit-g128-asym-awq": [*_GPTQ, "--no-sym", "--awq-scales"],
    "gptq-4bit-g128-act-order-asym-ts": [*_GPTQ, "--desc-act", "--no-sym", "--true-sequential",
                                         "--act-order-block", "1"],
    "gptq-4bit-g128-act-order-asym-awq-ts": [*_GPTQ, "--desc-act", "--no-sym", "--awq-scales",
                                             "--true-sequential", "--act-order-block", "1"],
    "awq-4bit-g64-plain": [*_AWQ, "--no-awq-gptq", "--no-output-clip", "--refine", "0"],
    "awq-4bit-g64-rtn": [*_AWQ, "--no-awq-gptq"],  # AutoAWQ's rounding (the old default)
    "awq-4bit-g64-gptq": [*_AWQ, "--no-static-groups"],  # GPTQ rounding in K order
    "awq-4bit-g64-gptq-static": [*_AWQ, "--awq-gptq", "--static-groups", "--refine", "1"],
    "awq-4bit-g64-descent": [*_AWQ, "--no-awq-gptq", "--descent", "2"],
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
    print(f"{'model':32s} {'ppl':>9s} {'unquantized':>12s} {'change':>8s} {'quantize s':>11s}")
    for name in ["unquantized", *PPL_METHODS]:
        if name not in rows:
            continue
        ppl = rows[name]["ppl"]
        change = f"{100 * (ppl / reference - 1):+7.2f}%" if reference else "n/a"
        print(f"{name:32s} {ppl:9.4f} {reference or float('nan'):12.4f} {change:>8s} "
              f"{rows[name]['quantize_s']:11.0f}")


# ---------------------------------------------------------------- GEMMs (GPU)

def cuda_time(fn, reps: int = 50, warmup: int = 10) -> float:
    """Median milliseconds of ``fn()`` over ``reps`` CUDA-event timed eager calls (includes
    the host's launch time when that exceeds the GPU's)."""
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


def graph_time(fn, inner: int = 20, reps: int = 7) -> float:
    """Median milliseconds per call of ``fn`` replayed from a CUDA graph of ``inner``
    back-to-back calls (how the engine runs decode): GPU time, no host launch cost."""
    fn()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(inner):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / inner)
    del graph
    return statistics.median(times)


def cycling(calls):
    """One callable that runs ``calls`` in turn, one per call: timed under a CUDA graph of
    ``graph_time``'s 20 calls, each captured call reads its own copy of the operands, so
    weights that fit in the L2 cache (an 8 MB W4A16 4096 x 4096, 60 MB of L2 on the
    H200) are read from memory, as a model's layers are, not from the cache."""
    turn = [0]

    def call():
        fn = calls[turn[0] % len(calls)]
        turn[0] += 1
        return fn()
    return call


def weight_copies(tensors: tuple, copies: int) -> list[tuple]:
    """``copies`` copies of a layer's tensors (None stays None), the first the tensors
    themselves: the timed calls cycle through them (``cycling``), so that with 16 each
    reads its weight from DRAM, as in decode, not from the L2 cache."""
    return [tensors] + [tuple(None if t is None else t.clone() for t in tensors)
                        for _ in range(copies - 1)]


def start_on_gpu() -> None:
    """What each GPU benchmark does first: seed torch (the same operands every run) and name
    the device in its log."""
    torch.manual_seed(0)
    print(torch.cuda.get_device_name(), flush=True)


def bf16_weight(k: int, n: int) -> torch.Tensor:
    """The bf16 weight [N, K] of a layer as the GEMM benchmarks draw it (normal, std 0.02,
    from torch's CUDA generator)."""
    return (torch.randn(n, k, device="cuda") * 0.02).to(torch.bfloat16)


W4A16_KERNELS = ("chosen", "interleaved", "canonical", "reference")


def w4a16_layer(qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                kernel: str = "chosen", group: int = 128) -> torch.nn.Module:
    """A bf16 W4A16 layer holding these canonical words (on their device), its kernel
    chosen as a model load chooses it ("chosen"), or forced to one family of
    ``tamis.quant.wna16_kernels`` (ValueError, with the reason, where it cannot run)."""
    from tamis.quant import wna16_kernels
    from tamis.quant.packing import unpack_int32
    from tamis.quant.wna16 import finalize_wna16, select_wna16_kernel
    k, n = qweight.shape[0] * 8, qweight.shape[1]
    layer = torch.nn.Module()
    layer.prefix = f"{k}x{n}"
    finalize_wna16(layer, unpack_int32(qweight, 4, 0, k), scales, zeros, group, 4,
                   act_dtype=torch.bfloat16)
    if kernel != "chosen":
        select_wna16_kernel(layer, torch.bfloat16, wna16_kernels.FAMILIES[kernel])
    return layer


def w4a16_operands(k: int, n: int, group: int = 128):
    from tamis.quant.packing import pack_int32
    codes = torch.randint(0, 16, (k, n), device="cuda")
    qweight = pack_int32(codes, 4, dim=0)
    scales = (torch.rand(k // group, n, device="cuda") * 0.002 + 0.001).half()
    zeros = torch.randint(0, 16, (k // group, n), device="cuda").half()
    return qweight, scales, zeros


def relative_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    """Max error over the largest reference value; inf where anything is NaN."""
    if torch.isnan(got).any():
        return float("inf")
    return ((got.float() - ref.float()).abs().max() / ref.float().abs().max()).item()


def run_gemm(args) -> None:
    import torch.nn.functional as F

    from tamis.kernels import fp8, pdl, w4a16
    from tamis.quant.wna16 import apply_wna16
    assert torch.cuda.is_available(), "gemm mode needs a CUDA GPU"
    torch.manual_seed(0)
    timer = cuda_time if args.eager else graph_time
    print(torch.cuda.get_device_name(), "fp8:", fp8.fp8_supported("cuda"),
          "timing:", "eager CUDA events" if args.eager else "CUDA graph replay", flush=True)
    rows, pdl_rows = [], []
    for k, n in SHAPES:
        weight = bf16_weight(k, n)
        qweight, scales, zeros = w4a16_operands(k, n)
        dense_w4 = w4a16.dequantize_wna16(qweight, scales, zeros, 128, 4, k)  # [K, N] fp32
        w8, w8_scale = _fp8_weight(weight)
        dense_w8 = w8.float() * w8_scale[:, None]  # [N, K] fp32
        # --rotate N: N copies of every weight, the timed calls cycling through them; the
        # W4A16 copies as layers whose kernel --kernel chose or forced.
        copies = [(w, w4a16_layer(q, s, z, args.kernel), w8c, w8s) for w, q, s, z, w8c, w8s
                  in weight_copies((weight, qweight, scales, zeros, w8, w8_scale), args.rotate)]
        print(f"{k}x{n}: W4A16 kernel {type(copies[0][1].wna16_kernel).__name__}", flush=True)
        for m in args.ms:
            x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            # Correctness first: W4A16 against the fp32 product with its dequantized weight;
            # FP8 against W8A16 (GEMV rows) or the W8A8 fp32 emulation (_scaled_mm rows).
            err = relative_error(apply_wna16(copies[0][1], x, None), x.float() @ dense_w4)
            assert err < 2e-2, f"W4A16 mismatch at M={m} {k}x{n}: rel err {err}"
            ref8 = (x.float() @ dense_w8.t() if m <= fp8.GEMV_DISPATCH_M
                    else fp8.fp8_linear_ref(x.float(), w8, w8_scale))
            err8 = relative_error(fp8.fp8_linear(x, w8, w8_scale), ref8)
            assert err8 < 2e-2, f"FP8 mismatch at M={m} {k}x{n}: rel err {err8}"
            t_bf16 = timer(cycling([lambda c=c: F.linear(x, c[0]) for c in copies]))
            t_w4_modes, t_fp8_modes = [], []
            for mode in args.pdl:  # the kernels' launch mode (tamis.kernels.pdl)
                pdl.set_mode(mode)
                t_w4_modes.append(timer(cycling([lambda c=c: apply_wna16(c[1], x, None)
                                                 for c in copies])))
                t_fp8_modes.append(timer(cycling([lambda c=c: fp8.fp8_linear(x, c[2], c[3])
                                                  for c in copies])))
            pdl.set_mode(args.pdl[0])
            t_w4, t_fp8 = t_w4_modes[0], t_fp8_modes[0]
            pdl_rows.append((f"{k}x{n}", m, t_bf16, t_w4_modes, t_fp8_modes))
            rows.append((f"{k}x{n}", m, t_bf16, t_w4, t_fp8))
            print(f"{k}x{n} M={m}: bf16 {t_bf16 * 1e3:.1f}us w4a16 {t_w4 * 1e3:.1f}us "
                  f"fp8 {t_fp8 * 1e3:.1f}us", flush=True)
    print(f"\nus per GEMM (median, {'eager' if args.eager else 'CUDA graph'}, "
          f"{args.rotate} weight cop{'y' if args.rotate == 1 else 'ies'}); "
          "x = bf16 time / ours")
    print(f"{'KxN':12s} {'M':>5s} {'bf16':>8s} {'W4A16':>8s} {'x':>6s} {'FP8':>8s} {'x':>6s}")
    for shape, m, tb, t4, t8 in rows:
        print(f"{shape:12s} {m:5d} {tb * 1e3:8.1f} {t4 * 1e3:8.1f} {tb / t4:6.2f} "
              f"{t8 * 1e3:8.1f} {tb / t8:6.2f}")
    if len(args.pdl) > 1:
        _print_pdl_table(args.pdl, pdl_rows)


def _print_pdl_table(modes, pdl_rows) -> None:
    """us per GEMM under each PDL launch mode (``tamis.kernels.pdl``), x = bf16 / ours."""
    print("\nus per GEMM by PDL mode (W4A16 | FP8), x = bf16 time / ours")
    heads = "".join(f" {'W4:' + mo:>10s} {'x':>5s}" for mo in modes)
    heads += "".join(f" {'F8:' + mo:>10s} {'x':>5s}" for mo in modes)
    print(f"{'KxN':12s} {'M':>5s} {'bf16':>8s}{heads}")
    for shape, m, tb, t4s, t8s in pdl_rows:
        cells = "".join(f" {t * 1e3:10.1f} {tb / t:5.2f}" for t in (*t4s, *t8s))
        print(f"{shape:12s} {m:5d} {tb * 1e3:8.1f}{cells}")


def _fp8_weight(weight):
    from tamis.quant.fp8 import quantize_weight_per_channel
    return quantize_weight_per_channel(weight)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="mode", required=True)
    ppl = sub.add_parser("ppl")
    ppl.add_argument("--tokens", type=int, default=20480)
    ppl.add_argument("--window", type=int, default=512)
    ppl.add_argument("--methods", nargs="+", default=list(PPL_METHODS), choices=list(PPL_METHODS))
    # Calibration windows x tokens: `tamis quantize`'s own defaults (16 x 512).
    ppl.add_argument("--num-samples", type=int, default=16)
    ppl.add_argument("--seq-len", type=int, default=512)
    ppl.add_argument("--no-reference", action="store_true",
                     help="skip the unquantized model (another process computes it)")
    ppl.add_argument("--threads", type=int, default=2)
    ppl.add_argument("--workdir", default=None, help="keep / reuse quantized checkpoints here")
    gemm = sub.add_parser("gemm")
    gemm.add_argument("--kernel", choices=W4A16_KERNELS, default="chosen",
                      help="the W4A16 kernel family: as chosen at load (default) or forced")
    gemm.add_argument("--eager", action="store_true",
                      help="time eager calls with CUDA events (default: CUDA-graph replay)")
    gemm.add_argument("--ms", type=int, nargs="+", default=MS)
    gemm.add_argument("--rotate", type=int, default=1,
                      help="copies of each weight, cycled through by the timed calls (e.g. 16:"
                           " more bytes than the L2 cache holds; default 1, as measured so far)")
    gemm.add_argument("--pdl", nargs="+", default=["auto"],
                      choices=["off", "exit", "late", "early", "auto"],
                      help="PDL launch modes of the W4A16 / FP8 kernels (tamis.kernels.pdl) to"
                           " time, each in the same process; the main table shows the first")
    args = parser.parse_args()
    run_ppl(args) if args.mode == "ppl" else run_gemm(args)


if __name__ == "__main__":
    main()
