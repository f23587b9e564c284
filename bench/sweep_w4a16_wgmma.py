"""Sweep the tiles of the wgmma W4A16 kernel (``tamis.kernels.w4a16_wgmma``) at
Llama-3.1-8B layer shapes on a Hopper GPU, against bf16 ``F.linear`` and the current
``w4a16_gemm`` dispatch on the same interleaved words, in the same process. Every
candidate is checked against the fp32 product with the dequantized weight (output
poisoned with NaN first) before it is timed (CUDA-graph replay, as decode runs).

    python bench/sweep_w4a16_wgmma.py [--ms 32 64 128] [--quick] [--verbose]
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_quant import SHAPES, graph_time, w4a16_operands  # noqa: E402


def candidates(m: int, n: int, k: int, quick: bool):
    """The default, then 64 columns on 4 warps, 128 on 4 or 8, 256 on 8; steps of 128 or
    64 rows; K split 1, 2 or 4 ways (at least 4 steps a split); rings of 2-4 slots."""
    from tamis.kernels.w4a16_wgmma import (SHARED_BYTES, WgmmaConfig, pick_wgmma_config,
                                           shared_bytes)
    yield "default", pick_wgmma_config(m, n, k, 128)
    if quick:
        return
    for bn, warps in ((64, 4), (128, 8), (256, 8), (128, 4)):
        for bk in (128, 64):
            for split in (1, 2, 4):
                for stages in (2, 3, 4):
                    cfg = WgmmaConfig(bn, bk, split, warps, stages)
                    if k // split >= 4 * bk and shared_bytes(cfg, m) <= SHARED_BYTES:
                        yield "", cfg


def check(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Max error over the largest reference value; inf where anything is NaN."""
    if torch.isnan(out).any():
        return float("inf")
    return ((out.float() - ref).abs().max() / ref.abs().max()).item()


def main() -> None:
    import torch.nn.functional as F

    from tamis.kernels import w4a16
    from tamis.kernels.w4a16_mma import mma_pack
    from tamis.kernels.w4a16_wgmma import w4a16_gemm_wgmma
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ms", type=int, nargs="+", default=[32, 64, 128])
    parser.add_argument("--quick", action="store_true", help="defaults only")
    parser.add_argument("--verbose", action="store_true", help="print every candidate's time")
    args = parser.parse_args()
    torch.manual_seed(0)
    print(torch.cuda.get_device_name(), flush=True)
    table = []
    for k, n in SHAPES:
        weight = (torch.randn(n, k, device="cuda") * 0.02).to(torch.bfloat16)
        qweight, scales, zeros = w4a16_operands(k, n)
        packed = mma_pack(qweight, k)
        dense = w4a16.dequantize_wna16(qweight, scales, zeros, 128, 4, k)
        for m in args.ms:
            x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            ref = x.float() @ dense
            t_bf16 = graph_time(lambda: F.linear(x, weight))
            t_cur = graph_time(lambda: w4a16.w4a16_gemm(x, packed, scales, zeros, 128,
                                                        interleaved=True))
            best, t_default = (float("inf"), None), None
            for tag, cfg in candidates(m, n, k, args.quick):
                torch.cuda.synchronize()
                try:
                    out = w4a16_gemm_wgmma(x, packed, scales, zeros, 128, cfg)
                except ValueError as exc:
                    print(f"  skip {cfg}: {exc}", flush=True)
                    continue
                err = check(out, ref)
                if err > 2e-2:
                    print(f"  WRONG {k}x{n} M={m} {cfg}: rel err {err:.3g}", flush=True)
                    continue
                t = graph_time(lambda: w4a16_gemm_wgmma(x, packed, scales, zeros, 128, cfg))
                if args.verbose:
                    print(f"  {k}x{n} M={m} {t * 1e3:.1f}us err {err:.2g} {cfg}", flush=True)
                if tag == "default":
                    t_default = t
                if t < best[0]:
                    best = (t, cfg)
            table.append((f"{k}x{n}", m, t_bf16, t_cur, t_default, best[0], best[1]))
            print(f"{k}x{n} M={m}: bf16 {t_bf16 * 1e3:.1f} current {t_cur * 1e3:.1f} "
                  f"wgmma default {t_default * 1e3 if t_default else float('nan'):.1f} "
                  f"best {best[0] * 1e3:.1f}us {best[1]}", flush=True)
    print("\nKxN           M    bf16  current   x   wgmma   x     best   x")
    for shape, m, tb, tc, td, tbest, cfg in table:
        td = td or float("nan")
        print(f"{shape:12s} {m:3d} {tb * 1e3:7.1f} {tc * 1e3:7.1f} {tb / tc:5.2f} "
              f"{td * 1e3:6.1f} {tb / td:5.2f} {tbest * 1e3:6.1f} {tb / tbest:5.2f}  {cfg}")


if __name__ == "__main__":
    main()
