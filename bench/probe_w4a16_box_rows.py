"""Probe: the TMA W4A16 kernel on one row block that x's rows fill only partly, its x
read as ``x_box_rows`` says (two half boxes where it halves them; session 21 call 3 ran
the rule before it kept whole boxes on the two-warpgroup tile and at 16 rows past x)
against one whole box (rows past x read as zeros), alternating in one process, bf16
``F.linear`` in each round; 16 weight copies cycled, CUDA-graph replay
(``bench_quant.py``'s method), each output checked against the fp32 product first. At
33..48 rows the one-box variant is the kernel as it was before ``x_box_rows``.

Where the tile is the wide layers' two-warpgroup one, a third column: half boxes on it
with the registers capped at 128 (``maxnreg``). Uncapped, half boxes take that tile from
128 to 136 registers under the H200's Triton 3.6 (sm_90 build on the CPU, session 22),
so one program fits a multiprocessor instead of two; capped, it builds at 128 with 24
bytes of stack. Capped halves won at 65..80 rows in session 23 and are the default
there since (``x_box_rows``), so at those rows the default column is the third's kernel.

    python bench/probe_w4a16_box_rows.py [--ms 33 40 48 72 96 104] [--rounds 2]
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_quant import (cycling, graph_time, interleaved_layer, parse_shapes,  # noqa: E402
                         start_on_gpu)
from tile_sweep import relative_error  # noqa: E402


def main() -> None:
    from tamis.kernels import w4a16_wgmma_tma
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ms", type=int, nargs="+", default=[33, 40, 48, 72, 96, 104])
    parser.add_argument("--shapes", nargs="+", help="KxN (default: all four)")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    start_on_gpu()
    halves = w4a16_wgmma_tma.x_box_rows

    def gemm(boxes, config=None):
        def run(x, packed, scales, zeros):
            w4a16_wgmma_tma.x_box_rows = boxes
            try:
                return w4a16_wgmma_tma.w4a16_gemm_wgmma_tma(x, packed, scales, zeros, 128,
                                                            config)
            finally:
                w4a16_wgmma_tma.x_box_rows = halves
        return run

    def whole(m, block_m, num_warps=4):
        return block_m

    def halves_on_any_tile(m, block_m, num_warps=4):
        return halves(m, block_m)

    print("KxN            M  boxes    bf16 default   whole  capped  (us; boxes: rows of a box "
          "at 4 warps; capped: halves at 8 warps, 128 registers)")
    for k, n in parse_shapes(args.shapes):
        ref_weight, copies = interleaved_layer(k, n, 16)
        _, packed, scales, zeros = copies[0]
        for m in args.ms:
            x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            ref = x.float() @ ref_weight
            variants = [gemm(halves), gemm(whole)]
            config = w4a16_wgmma_tma.pick_tma_config(m, n, k, 128)
            if config.num_warps == 8:
                variants.append(gemm(halves_on_any_tile, dataclasses.replace(config, maxnreg=128)))
            for variant in variants:
                err = relative_error(variant(x, packed, scales, zeros), ref)
                assert err < 2e-2, f"{k}x{n} M={m}: rel err {err:.3g}"
            block_m = w4a16_wgmma_tma.tma_block_m(m)
            for _ in range(args.rounds):
                t_bf16 = graph_time(cycling([lambda c=c: F.linear(x, c[0]) for c in copies]))
                times = [graph_time(cycling([lambda c=c, v=v: v(x, *c[1:]) for c in copies]))
                         for v in variants]
                capped = f"{times[2] * 1e3:7.1f}" if len(times) > 2 else "      -"
                print(f"{k}x{n:<6} {m:4d} {halves(m, block_m):3d}/{block_m:<3d} "
                      f"{t_bf16 * 1e3:7.1f} {times[0] * 1e3:7.1f} {times[1] * 1e3:7.1f} "
                      f"{capped}", flush=True)


if __name__ == "__main__":
    main()
