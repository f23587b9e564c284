"""Tile sweep of the W4A16 tl.dot kernels at M = 16 and 64 (H200, device tool).

    python3 -P bench/sweep_w4a16_tiles.py [--ms 16 64] [--quick]

Times, per Llama-3.1-8B layer shape and M, bf16 ``F.linear``, the dispatched
``w4a16_gemm`` and a grid of ``GemmConfig`` tiles of ``w4a16_gemm_triton`` (words
unpacked once by reshape, or loaded once per row; tiles of 16 / 32 rows run Ampere-style
MMAs on Hopper, whose warpgroup MMA needs 64). Each candidate is checked against the fp32
reference before it is timed (CUDA-graph replay, ``bench_quant.graph_time``). Prints the
three fastest per cell and a summary table. At M = 64 the grid has 816 candidates (the
64-row tiles alone, 272, took about 2.5 minutes on the H200); ``--quick`` times every
third candidate.
"""
from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_quant import (SHAPES, _rel_err, bf16_weight, graph_time,  # noqa: E402
                         w4a16_operands)


def grid(m: int):
    from tamis.kernels.w4a16 import GemmConfig
    block_ms = [b for b in (16, 32, 64) if b <= max(16, m)]
    for block_m, bn, bk, warps, stages, split, once in itertools.product(
            block_ms, (64, 128, 256), (64, 128), (4, 8), (2, 3, 4), (1, 2, 4, 8), (True, False)):
        if bn == 256 and bk == 128 and stages == 4:
            continue  # over the shared-memory budget
        yield GemmConfig(block_m, bn, bk, split, warps, stages, once)


def label(c) -> str:
    return (f"m{c.block_m} n{c.block_n} k{c.block_k} sk{c.split_k} w{c.num_warps} "
            f"s{c.num_stages}{' once' if c.unpack_once else ''}")


def main() -> None:
    from tamis.kernels import w4a16
    parser = argparse.ArgumentParser()
    parser.add_argument("--ms", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--quick", action="store_true", help="every 3rd candidate")
    args = parser.parse_args()
    torch.manual_seed(0)
    rows = []
    for k, n in SHAPES:
        weight = bf16_weight(k, n)
        qweight, scales, zeros = w4a16_operands(k, n)
        dense = w4a16.dequantize_wna16(qweight, scales, zeros, 128, 4, k)
        for m in args.ms:
            x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            ref = x.float() @ dense
            t_bf16 = graph_time(lambda: F.linear(x, weight))
            t_now = graph_time(lambda: w4a16.w4a16_gemm(x, qweight, scales, zeros, 128))
            results = []
            for i, c in enumerate(grid(m)):
                if args.quick and i % 3:
                    continue
                run = (lambda c=c: w4a16.w4a16_gemm_triton(x, qweight, scales, zeros, 128, 4,
                                                          config=c))
                try:
                    err = _rel_err(run(), ref)
                    if err >= 2e-2:
                        print(f"  {label(c)}: WRONG {err:.3g}", flush=True)
                        continue
                    results.append((graph_time(run), label(c)))
                except Exception as exc:  # out of shared memory, register spills: skip
                    print(f"  {label(c)} failed: {type(exc).__name__}", file=sys.stderr)
            results.sort()
            print(f"{k}x{n} M={m}: bf16 {t_bf16 * 1e3:.1f} now {t_now * 1e3:.1f} | " + " | ".join(
                f"{t * 1e3:.1f} {name}" for t, name in results[:3]), flush=True)
            best = results[0] if results else (float("nan"), "none")
            rows.append((f"{k}x{n}", m, t_bf16, t_now, best[0], best[1]))
    print("\nus per GEMM (CUDA graph); x = bf16 / ours")
    for shape, m, tb, tn, tbest, name in rows:
        print(f"{shape:12s} M={m:3d} bf16 {tb * 1e3:6.1f} now {tn * 1e3:6.1f} ({tb / tn:4.2f}x) "
              f"best {tbest * 1e3:6.1f} ({tb / tbest:4.2f}x) {name}")


if __name__ == "__main__":
    main()
