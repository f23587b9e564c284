"""Who sums split K: the last split to arrive, or always the last split (its partners not
waiting for the counter, its loads in one round; for the TMA kernel also with the
partials in thread order, ``linear_partials``)? Each, for every kernel that splits K in
one launch, at Llama-3.1-8B layer shapes on the H200, weights cycled from DRAM,
CUDA-graph timing, against bf16 ``F.linear`` in the same process:

    python3 -P bench/sweep_split_reduce.py [--ms 1 16 32 64] [--rotate 16]

Rows: the FP8 W8A16 GEMV and the dense bf16 GEMV (``tamis.kernels.gemv``) at one row,
the MMA-fragment W4A16 kernel at one row, the TMA wgmma kernel at 16..64 rows; each at
its default tile and with K split twice and half as many ways. The sums are the same
additions in the same order, so the outputs must be bit-equal (checked first).
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_quant import (SHAPES, bf16_weight, cycling, graph_time,  # noqa: E402
                         start_on_gpu, w4a16_operands)


def kernels_at(m: int, k: int, n: int):
    """(name, default config, run(operands, config)) of the kernels that take M rows."""
    from tamis.kernels import fp8, gemv
    from tamis.kernels.w4a16_mma import pick_mma_config, w4a16_gemm_mma
    from tamis.kernels.w4a16_wgmma_tma import pick_tma_config, w4a16_gemm_wgmma_tma
    if m == 1:
        yield ("fp8 gemv", gemv.pick_gemv_tiles(m, n, k),
               lambda o, c: fp8.fp8_gemv_triton(o["x"], o["w8"], o["s8"], c))
        yield ("bf16 gemv", gemv.pick_gemv_tiles(m, n, k, weight_bytes=2),
               lambda o, c: gemv.gemv_triton(o["x"], o["w"], None, c))
        yield ("w4 mma", pick_mma_config(m, n, k, 128),
               lambda o, c: w4a16_gemm_mma(o["x"], o["p"], o["s"], o["z"], 128, c))
    else:
        yield ("w4 tma", pick_tma_config(m, n, k, 128),
               lambda o, c: w4a16_gemm_wgmma_tma(o["x"], o["p"], o["s"], o["z"], 128, c))


def main() -> None:
    import torch.nn.functional as F

    from tamis.kernels.w4a16_mma import mma_pack
    from tamis.quant.fp8 import quantize_weight_per_channel
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ms", type=int, nargs="+", default=[1, 16, 32, 64])
    parser.add_argument("--rotate", type=int, default=16)
    args = parser.parse_args()
    start_on_gpu()
    print(f"{'KxN':11s} {'M':>3s} {'kernel':10s} {'split':>5s} {'bf16':>6s} "
          f"{'arrival':>8s} {'x':>5s} {'last':>7s} {'x':>5s} {'linear':>7s} {'x':>5s}")
    for k, n in SHAPES:
        weight = bf16_weight(k, n)
        qweight, scales, zeros = w4a16_operands(k, n)
        w8, s8 = quantize_weight_per_channel(weight)
        one = dict(w=weight, p=mma_pack(qweight, k), s=scales, z=zeros, w8=w8, s8=s8)
        copies = [one] + [{key: t.clone() for key, t in one.items()}
                          for _ in range(args.rotate - 1)]
        for m in args.ms:
            x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            for ops in copies:
                ops["x"] = x
            t_bf16 = graph_time(cycling([lambda o=o: F.linear(x, o["w"]) for o in copies]))
            for name, default, run in kernels_at(m, k, n):
                for split in sorted({default.split_k, default.split_k * 2,
                                     max(1, default.split_k // 2)}):
                    if split == 1:
                        continue
                    times = []
                    outs = []
                    sums = [dict(last_split_reduces=False), dict(last_split_reduces=True)]
                    if hasattr(default, "linear_partials"):
                        sums = [{**how, "linear_partials": False} for how in sums]
                        sums.append(dict(last_split_reduces=True, linear_partials=True))
                    for how in sums:
                        cfg = replace(default, split_k=split, **how)
                        outs.append(run(copies[0], cfg))
                        times.append(graph_time(cycling([lambda o=o, c=cfg: run(o, c)
                                                         for o in copies])))
                        outs.append(run(copies[0], cfg))
                    same = all(torch.equal(o, outs[0]) for o in outs)
                    mark = "*" if split == default.split_k else " "
                    print(f"{k}x{n:<6d} {m:3d} {name:10s} {split:4d}{mark} "
                          f"{t_bf16 * 1e3:6.1f} {times[0] * 1e3:8.2f} {t_bf16 / times[0]:5.2f} "
                          f"{times[1] * 1e3:7.2f} {t_bf16 / times[1]:5.2f}"
                          + "".join(f" {t * 1e3:7.2f} {t_bf16 / t:5.2f}" for t in times[2:])
                          + ("" if same else "  NOT BIT-EQUAL"), flush=True)


if __name__ == "__main__":
    main()
