"""Sweep the FP8 W8A16 GEMV's tiles (``tamis.kernels.gemv``, one row of x) at Llama-3.1-8B
layer shapes with the weights read from DRAM, as in decode: ``--rotate`` copies of every
weight, the timed calls cycling through them (``bench_quant.cycling``). Earlier sweeps of
this kernel (sessions 5-6) timed one copy, which the H200's 60 MB L2 holds.

    python3 -P bench/sweep_fp8_gemv.py [--grid wide|small] [--rotate 16]
        [--shapes 4096x6144 ...] [--top 5]

Every candidate is checked against the fp32 product with the dequantized weight (a
relative error over 2e-2 is WRONG and not timed) before CUDA-graph timing
(``bench_quant.graph_time``). Per shape: bf16 ``F.linear``, the default tile, the
fastest candidates.
"""
from __future__ import annotations

import argparse
import itertools
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_quant import (_fp8_weight, _label, _rel_err, bf16_weight, cycling,  # noqa: E402
                         graph_time, parse_shapes, start_on_gpu, weight_copies)


GRIDS = {
    # rows per program, K per step, pipeline depth, warps, K splits
    "wide": ((8, 16, 32), (256, 512, 1024), (3, 4, 6), (4, 8), (1, 2)),
    # around the wide grid's winners (call 1 of session 15): small tiles, K unsplit
    "small": ((4, 8, 16), (512, 1024, 2048), (3, 4), (2, 4, 8), (1, 2)),
}


def candidates(grid: str = "wide"):
    """The grid's tiles, less those whose fp32 accumulator would pass 128 registers a
    thread or hold under 16, or whose pipeline would pass 160 KB of shared memory (split
    K summed by the last to arrive)."""
    from tamis.kernels.gemv import GemvTiles
    for bn, bk, stages, warps, split in itertools.product(*GRIDS[grid]):
        if not 16 <= bn * bk // (32 * warps) <= 128 or stages * bn * bk > 160 * 1024:
            continue
        yield GemvTiles(bn, bk, split, warps, 3, loop_stages=stages)


def main() -> None:
    import torch.nn.functional as F

    from tamis.kernels import fp8
    from tamis.kernels.gemv import pick_gemv_tiles, sm_count
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grid", choices=sorted(GRIDS), default="wide")
    parser.add_argument("--rotate", type=int, default=16)
    parser.add_argument("--shapes", nargs="+", help="KxN (default: all four)")
    parser.add_argument("--top", type=int, default=5)
    args = parser.parse_args()
    shapes = parse_shapes(args.shapes)
    start_on_gpu()
    table = []
    for k, n in shapes:
        weight = bf16_weight(k, n)
        w8, w8_scale = _fp8_weight(weight)
        copies = weight_copies((weight, w8, w8_scale), args.rotate)
        x = torch.randn(1, k, device="cuda").to(torch.bfloat16)
        ref = x.float() @ (w8.float() * w8_scale[:, None]).t()
        t_bf16 = graph_time(cycling([lambda c=c: F.linear(x, c[0]) for c in copies]))
        default = pick_gemv_tiles(1, n, k, sm_count(x), 1)
        timed = []
        for cfg in [default, *candidates(args.grid)]:
            try:
                err = _rel_err(fp8.fp8_gemv_triton(x, w8, w8_scale, config=cfg), ref)
            except Exception as exc:  # a tile that fails to build
                print(f"  skip {_label(cfg)}: {type(exc).__name__}: {str(exc)[:100]}", flush=True)
                continue
            if err > 2e-2:
                print(f"  WRONG {k}x{n} {_label(cfg)}: rel err {err:.3g}", flush=True)
                continue
            t = graph_time(cycling([lambda c=c, cfg=cfg: fp8.fp8_gemv_triton(x, c[1], c[2], cfg)
                                    for c in copies]))
            timed.append((t, cfg))
            print(f"  {k}x{n} {t * 1e3:6.2f}us {t_bf16 / t:5.2f}x {_label(cfg)}", flush=True)
        t_default = timed[0][0] if timed and timed[0][1] == default else float("nan")
        table.append((f"{k}x{n}", t_bf16, t_default, default, sorted(timed, key=lambda r: r[0])))
    print(f"\nFP8 GEMV, one row, {args.rotate} weight copies; us (x = bf16 / it)")
    for shape, tb, td, default, ranked in table:
        print(f"{shape:12s} bf16 {tb * 1e3:6.2f}  default {td * 1e3:6.2f} {tb / td:5.2f}x "
              f"({_label(default)})")
        for t, cfg in ranked[:args.top]:
            print(f"{'':12s}        {t * 1e3:6.2f} {tb / t:5.2f}x  {_label(cfg)}")


if __name__ == "__main__":
    main()
