"""W4A16 at 65..256 rows of x (a busy decode batch, a short prefill chunk) on a Hopper GPU:
the TMA wgmma kernel over row blocks of x (``w4a16_gemm``'s dispatch there)
against bf16 ``F.linear`` and the kernels that had these rows before it (the tl.dot kernel
below ``DEQUANT_MIN_M`` rows, dequantize + cuBLAS from there), on the interleaved words a
model's layers hold, 16 weight copies cycled, CUDA-graph replay; each output checked
against the fp32 product.

    python bench/bench_w4a16_rows.py [--ms 65 96 128 192 256] [--shapes 4096x4096 ...]
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_quant import (cycling, graph_time, interleaved_layer, parse_shapes,  # noqa: E402
                         start_on_gpu)


def main() -> None:
    from tamis.kernels import w4a16
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ms", type=int, nargs="+", default=[65, 96, 128, 192, 256])
    parser.add_argument("--shapes", nargs="+", help="KxN (default: all four)")
    args = parser.parse_args()
    start_on_gpu()
    print("KxN            M    bf16  before     x     now     x  (us; x = bf16 / ours)")
    for k, n in parse_shapes(args.shapes):
        ref_weight, copies = interleaved_layer(k, n, 16)
        _, packed, scales, zeros = copies[0]
        for m in args.ms:
            x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            before = (w4a16.w4a16_gemm_dequant if m >= w4a16.DEQUANT_MIN_M
                      else w4a16.w4a16_gemm_triton)
            times = []
            for gemm in (None, before, w4a16.w4a16_gemm):
                if gemm is None:
                    calls = [lambda c=c: F.linear(x, c[0]) for c in copies]
                else:
                    out = gemm(x, packed, scales, zeros, 128, interleaved=True)
                    err = ((out.float() - x.float() @ ref_weight).abs().max()
                           / (x.float() @ ref_weight).abs().max()).item()
                    assert err < 2e-2, f"{gemm.__name__} at {k}x{n} M={m}: rel err {err:.3g}"
                    calls = [lambda c=c, g=gemm: g(x, c[1], c[2], c[3], 128, interleaved=True)
                             for c in copies]
                times.append(graph_time(cycling(calls)) * 1e3)
            t_bf16, t_before, t_now = times
            print(f"{k}x{n:<6} {m:4d} {t_bf16:7.1f} {t_before:7.1f} {t_bf16 / t_before:5.2f} "
                  f"{t_now:7.1f} {t_bf16 / t_now:5.2f}", flush=True)


if __name__ == "__main__":
    main()
