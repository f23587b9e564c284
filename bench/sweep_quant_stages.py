"""Sweep of software-pipelined loads (``tl.range(num_stages=...)``) in the quantized
GEMV / GEMM kernels at Llama-3.1-8B layer shapes (H200, device tool).

    python3 -P bench/sweep_quant_stages.py [--parts gemv fp8 gemm] [--ms 16 64]

Triton pipelines loads that feed no ``tl.dot`` only inside a ``tl.range`` loop given
``num_stages``; the GEMVs (packed-PTX W4A16 at M = 1, FP8 W8A16) had plain loads, one tile
prefetched into registers at most. For each shape: bf16 ``F.linear``, the dispatched kernel,
then candidates, each checked against its fp32 reference before it is timed (CUDA-graph
replay, ``bench_quant.graph_time``). Prints every candidate and a summary of the fastest.
"""
from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_quant import (SHAPES, _best, _fp8_weight, _label, _rel_err,  # noqa: E402
                         bf16_weight, graph_time, w4a16_operands)


def packed_gemv_grid(n: int):
    from tamis.kernels.w4a16_gemv_packed import PackedGemvConfig, pick_packed_gemv_config
    base = pick_packed_gemv_config(n, 0)
    for (bn, kw), stages, split in itertools.product(
            ((256, 16), (512, 8), (256, 32), (512, 16), (128, 32)), (2, 3, 4),
            (base.split_k, 2 * base.split_k)):
        yield PackedGemvConfig(bn, kw, split, 4, False, stages)


def fp8_gemv_grid(n: int):
    from tamis.kernels.gemv import GemvTiles, pick_gemv_tiles
    base = pick_gemv_tiles(1, n, 0)
    for bk, stages, split in itertools.product((256, 512), (2, 3, 4),
                                               (base.split_k, 2 * base.split_k)):
        yield GemvTiles(16, bk, split, 4, 3, loop_stages=stages)


def gemm_grid(m: int):
    from tamis.kernels.w4a16 import GemmConfig
    block_m = 16 if m <= 16 else 64
    for (bn, warps), stages, split in itertools.product(
            ((64, 4), (128, 4), (128, 8)), (3, 4), (1, 2, 4, 8)):
        yield GemmConfig(block_m, bn, 128, split, warps, stages, True)


def main() -> None:
    from tamis.kernels import fp8, w4a16
    parser = argparse.ArgumentParser()
    parser.add_argument("--parts", nargs="+", default=["gemv", "fp8", "gemm"])
    parser.add_argument("--ms", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--shapes", type=int, default=len(SHAPES), help="first N shapes")
    args = parser.parse_args()
    torch.manual_seed(0)
    rows = []
    for k, n in SHAPES[:args.shapes]:
        weight = bf16_weight(k, n)
        qweight, scales, zeros = w4a16_operands(k, n)
        dense = w4a16.dequantize_wna16(qweight, scales, zeros, 128, 4, k)
        cells = []
        if "gemv" in args.parts:
            cells.append(("W4 gemv", 1, lambda x: w4a16.w4a16_gemm(x, qweight, scales, zeros, 128),
                          lambda x, c: w4a16.w4a16_gemv_packed(x, qweight, scales, zeros, 128, 4,
                                                               config=c),
                          list(packed_gemv_grid(n)), lambda x: x.float() @ dense))
        if "fp8" in args.parts:
            w8, w8_scale = _fp8_weight(weight)
            dense8 = (w8.float() * w8_scale[:, None]).t()
            cells.append(("FP8 gemv", 1, lambda x: fp8.fp8_linear(x, w8, w8_scale),
                          lambda x, c: fp8.fp8_gemv_triton(x, w8, w8_scale, config=c),
                          list(fp8_gemv_grid(n)), lambda x, d=dense8: x.float() @ d))
        if "gemm" in args.parts:
            for m in args.ms:
                cells.append(("W4 gemm", m,
                              lambda x: w4a16.w4a16_gemm(x, qweight, scales, zeros, 128),
                              lambda x, c: w4a16.w4a16_gemm_triton(x, qweight, scales, zeros,
                                                                   128, 4, config=c),
                              list(gemm_grid(m)), lambda x: x.float() @ dense))
        for name, m, now, run, grid, reference in cells:
            x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            ref = reference(x)
            assert _rel_err(now(x), ref) < 2e-2, f"{name} {k}x{n} M={m}: default is wrong"
            t_bf16 = graph_time(lambda: F.linear(x, weight))
            t_now = graph_time(lambda: now(x))
            print(f"{k}x{n} {name} M={m}: bf16 {t_bf16 * 1e3:.1f}us now {t_now * 1e3:.1f}us",
                  flush=True)
            candidates = [(_label(c), (lambda c=c: run(x, c)), lambda got: _rel_err(got, ref))
                          for c in grid]
            t_best, label = _best(candidates, graph_time)
            rows.append((f"{k}x{n}", name, m, t_bf16, t_now, t_best, label))
    print("\nus per call (CUDA graph); x = bf16 / ours")
    for shape, name, m, tb, tn, tbest, label in rows:
        print(f"{shape:12s} {name:9s} M={m:3d} bf16 {tb * 1e3:6.1f} now {tn * 1e3:6.1f} "
              f"({tb / tn:4.2f}x) {label} ({tb / tbest:4.2f}x)")


if __name__ == "__main__":
    main()
