"""Where the one-row W4A16 time goes beyond reading the bytes (session 18's open question:
23% fewer loop instructions left the 4096-deep layers as fast as before). Two probes on
the default one-row tiles (``pick_mma_config(1, ...)``), 16 weight copies cycled,
CUDA-graph replay, bf16 ``F.linear`` alongside (``bench_quant.py``'s method):

1. ``--probe sum``: the kernel as it runs (A) against the same launch whose splits each
   store their partial straight to the output (B: ``HAS_SPLIT`` forced off, so the sums
   are wrong and racy): A - B is what summing the splits costs (partials stored, counter
   released and awaited, partials loaded, the tail program's last round trips).
2. ``--probe steps``: 4096 x 4096's default tile (128 columns on 4 warps, K split 16)
   on K = 2048, 4096, 8192 and 16384 (1, 2, 4, 8 steps a program, the same grid): the
   time against the steps a program runs, whose intercept is the per-launch fixed part
   (launch, first round trip, split sum) and whose slope is a step of every program.

    python bench/probe_w4a16_split_tail.py --probe sum [--rounds 3]
    python bench/probe_w4a16_split_tail.py --probe steps
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_quant import (SHAPES, bf16_weight, cycling, graph_time, start_on_gpu,  # noqa: E402
                         w4a16_operands, weight_copies)


def timed(kernel, x, copies) -> float:
    """Microseconds per call of kernel(x, words, scales, zeros) over the cycled copies."""
    return 1e3 * graph_time(cycling([lambda c=c: kernel(x, c[1], c[2], c[3]) for c in copies]))


def probe_sum(rounds: int) -> None:
    from tamis.kernels import w4a16_mma
    from tamis.kernels.w4a16_mma import mma_pack, w4a16_gemm_mma
    built = w4a16_mma.mma_constexprs

    def unsummed(*args, **kwargs):
        return {**built(*args, **kwargs), "HAS_SPLIT": False}

    def kernel(x, words, scales, zeros, sums=True):
        w4a16_mma.mma_constexprs = built if sums else unsummed
        try:
            return w4a16_gemm_mma(x, words, scales, zeros, 128)
        finally:
            w4a16_mma.mma_constexprs = built

    for k, n in SHAPES:
        qweight, scales, zeros = w4a16_operands(k, n)
        copies = weight_copies((bf16_weight(k, n), mma_pack(qweight, k), scales, zeros), 16)
        x = torch.randn(1, k, device="cuda").to(torch.bfloat16)
        for _ in range(rounds):
            t_bf16 = 1e3 * graph_time(cycling([lambda c=c: F.linear(x, c[0]) for c in copies]))
            a = timed(kernel, x, copies)
            b = timed(lambda *t: kernel(*t, sums=False), x, copies)
            print(f"{k}x{n} bf16 {t_bf16:.2f} summed {a:.2f} unsummed {b:.2f} "
                  f"(the sum: {a - b:.2f} us)", flush=True)


def probe_steps() -> None:
    from tamis.kernels.w4a16_mma import MmaConfig, mma_pack, w4a16_gemm_mma
    config = MmaConfig(128, 128, 16, 4, params_ahead=True, paired_steps=True,
                       last_split_reduces=True)
    n = 4096
    for k in (2048, 4096, 8192, 16384):
        qweight, scales, zeros = w4a16_operands(k, n)
        copies = weight_copies((bf16_weight(k, n), mma_pack(qweight, k), scales, zeros), 16)
        x = torch.randn(1, k, device="cuda").to(torch.bfloat16)
        t = timed(lambda *a: w4a16_gemm_mma(*a, 128, config), x, copies)
        t_bf16 = 1e3 * graph_time(cycling([lambda c=c: F.linear(x, c[0]) for c in copies]))
        print(f"{k}x{n} {k // (16 * 128)} steps a program: {t:.2f} us (bf16 {t_bf16:.2f}; "
              f"{k * n / 2 / t / 1e6:.2f} TB/s of words)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--probe", choices=("sum", "steps"), required=True)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    start_on_gpu()
    probe_sum(args.rounds) if args.probe == "sum" else probe_steps()


if __name__ == "__main__":
    main()
