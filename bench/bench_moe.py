"""Fused-MoE layer on the GPU: tamis's Triton kernel against its torch reference and vLLM's
``fused_experts`` (when vLLM imports), on one Mixtral-8x7B layer by default
(E=8, top-2, H=4096, I=14336, bf16 random weights) at 1, 64 and 2,048 tokens.

    python bench/bench_moe.py [--tokens 1 64 2048] [--experts 8 --top-k 2
                               --hidden 4096 --intermediate 14336]

Routing (softmax, top-k, renormalised) is computed once per batch size and is not timed:
each row times the experts alone, from routed tokens to the summed output, eager
(``triton.testing.do_bench``, median) and replayed from a CUDA graph (what a decode step
runs). Every output is checked against the reference before it is timed. ``floor`` is the
expert weights the batch touches divided by the measured copy bandwidth.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

import torch

from tamis.engine.layers.fused_moe import select_experts
from tamis.kernels.fused_moe import default_tiles, fused_experts_ref, fused_experts_triton

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_quant import graph_time  # noqa: E402


def bench_ms(fn) -> float:
    from triton.testing import do_bench
    return do_bench(fn, warmup=25, rep=200, return_mode="median")


def graph_ms(fn) -> float | None:
    """Milliseconds per call replayed from a CUDA graph (``bench_quant.graph_time``);
    None if ``fn`` cannot be captured."""
    try:
        return graph_time(fn)
    except RuntimeError:
        return None


def copy_bandwidth() -> float:
    """Device-to-device copy of 2 GiB, bytes read + written per second."""
    src = torch.empty(1024**3, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    return 2 * src.numel() * 2 / (bench_ms(lambda: dst.copy_(src)) * 1e-3)


def vllm_fused_experts():
    """vLLM's unquantized fused_experts, or the reason it is not available."""
    try:
        from vllm.model_executor.layers.fused_moe import fused_experts
    except Exception as exc:  # not installed, or built for another torch
        return None, f"{type(exc).__name__}: {exc}"
    return fused_experts, None


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.double(), want.double()
    return float((got - want).norm() / want.norm().clamp_min(1e-30))


def run_case(tokens: int, w13, w2, top_k: int, bandwidth: float, vllm) -> list[dict]:
    experts, hidden = w13.shape[0], w13.shape[2]
    x = torch.randn(tokens, hidden, device="cuda", dtype=w13.dtype)
    weights, ids = select_experts(torch.randn(tokens, experts, device="cuda"), top_k, True)
    touched = ids.unique().numel()
    floor_ms = touched * (w13[0].numel() + w2[0].numel()) * w13.element_size() / bandwidth * 1e3
    want = fused_experts_ref(x, w13, w2, weights, ids)
    candidates = {"reference": lambda: fused_experts_ref(x, w13, w2, weights, ids),
                  "tamis": lambda: fused_experts_triton(x, w13, w2, weights, ids)}
    if vllm is not None:
        candidates["vllm"] = lambda: vllm(x, w13, w2, weights, ids)
    rows = []
    for name, fn in candidates.items():
        rows.append(dict(tokens=tokens, kernel=name, rel_err=round(relative_error(fn(), want), 5),
                         ms=round(bench_ms(fn), 4),
                         graph_ms=None if name == "reference" else _rounded(graph_ms(fn)),
                         floor_ms=round(floor_ms, 4), experts_touched=touched))
        print(json.dumps(rows[-1]), flush=True)
    tiles = default_tiles(tokens, experts)
    print(json.dumps(dict(tokens=tokens, tamis_tiles=dataclasses.asdict(tiles))), flush=True)
    return rows


def _rounded(ms: float | None) -> float | None:
    return None if ms is None else round(ms, 4)


def print_table(rows: list[dict]) -> None:
    print(f"\n{'tokens':>6} {'kernel':>9} {'ms':>8} {'graph ms':>9} {'floor ms':>9} "
          f"{'rel err':>8}  vLLM time / this (graph times where captured)")
    vllm_ms = {r["tokens"]: r["graph_ms"] or r["ms"] for r in rows if r["kernel"] == "vllm"}
    for r in rows:
        mine = r["graph_ms"] or r["ms"]
        ratio = f"{vllm_ms[r['tokens']] / mine:.2f}x" if r["tokens"] in vllm_ms else "-"
        graph = "-" if r["graph_ms"] is None else f"{r['graph_ms']:.4f}"
        print(f"{r['tokens']:>6} {r['kernel']:>9} {r['ms']:>8.4f} {graph:>9} "
              f"{r['floor_ms']:>9.4f} {r['rel_err']:>8.5f}  {ratio}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 64, 2048])
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--intermediate", type=int, default=14336)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_moe.py needs a CUDA GPU")
    torch.manual_seed(0)
    e, h, i = args.experts, args.hidden, args.intermediate
    w13 = (torch.randn(e, 2 * i, h, device="cuda") * h ** -0.5).bfloat16()
    w2 = (torch.randn(e, h, i, device="cuda") * i ** -0.5).bfloat16()
    vllm, reason = vllm_fused_experts()
    print(json.dumps(dict(device=torch.cuda.get_device_name(), shape=dict(E=e, top_k=args.top_k,
                                                                     H=h, I=i),
                          vllm=reason or "fused_experts imported")), flush=True)
    bandwidth = copy_bandwidth()
    rows = [row for tokens in args.tokens
            for row in run_case(tokens, w13, w2, args.top_k, bandwidth, vllm)]
    print_table(rows)


if __name__ == "__main__":
    main()
