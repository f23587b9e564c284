"""Sweep the tiles of the MMA-fragment W4A16 kernel (``tamis.kernels.w4a16_mma``) at
Llama-3.1-8B layer shapes on a CUDA GPU, against bf16 ``F.linear`` and the current
``w4a16_gemm`` dispatch in the same process. Every candidate is checked against the fp32
product with the dequantized weight before it is timed (CUDA-graph replay, as decode runs).

    python bench/sweep_w4a16_mma.py [--ms 1 16 32 64] [--quick] [--verbose]
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_quant import SHAPES, graph_time, w4a16_operands  # noqa: E402


def candidates(m: int, n: int, k: int, quick: bool):
    """The default, then tiles around it: 64-256 columns on 2-8 warps, K split 1-16
    ways, 1, 2 or 4 steps loaded together, columns permuted for vector loads or not;
    above 16 rows, rows of x split over 2 or 4 warps, or x staged in shared memory."""
    from tamis.kernels.w4a16_mma import MmaConfig, pick_mma_config
    yield "default", pick_mma_config(m, n, k, 128)
    if quick:
        return
    if m <= 16:
        for bn, warps in ((64, 2), (128, 2), (128, 4), (128, 8), (256, 8)):
            for split in (4, 8, 16):
                for steps in (1, 2):
                    for vector in (True, False):
                        yield "", MmaConfig(bn, 128, split, warps, load_steps=steps,
                                            vector_columns=vector)
        for bn, warps in ((64, 2), (128, 8)):
            for split in (2, 4, 8):
                yield "", MmaConfig(bn, 128, split, warps, load_steps=4)
        return
    rows = 64 if m > 32 else 32
    for bn, bk, warps, warps_m in ((64, 64, 4, 4), (128, 64, 8, 4), (64, 128, 4, 2)):
        for split in (1, 2, 4):
            yield "", MmaConfig(bn, bk, split, warps, 1, rows, warps_m)
    for bn, bk, warps, warps_m in ((64, 64, 4, 1), (128, 64, 8, 1), (128, 64, 4, 1),
                                   (256, 64, 8, 1), (128, 64, 8, 2), (64, 128, 4, 1)):
        for split in (1, 2, 4):
            yield "", MmaConfig(bn, bk, split, warps, 1, rows, warps_m, x_shared=True)
            yield "", MmaConfig(bn, bk, split, warps, 1, rows, warps_m, x_shared=True,
                                load_steps=2)


def main() -> None:
    import torch.nn.functional as F

    from tamis.kernels import w4a16
    from tamis.kernels.w4a16_mma import mma_pack, w4a16_gemm_mma
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ms", type=int, nargs="+", default=[1, 16, 32, 64])
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
            scale = ref.abs().max()
            t_bf16 = graph_time(lambda: F.linear(x, weight))
            t_cur = graph_time(lambda: w4a16.w4a16_gemm(x, qweight, scales, zeros, 128))
            t_tl = graph_time(lambda: w4a16.w4a16_gemm(x, packed, scales, zeros, 128,
                                                       interleaved=True))
            best = (float("inf"), None)
            t_default = None
            for tag, cfg in candidates(m, n, k, args.quick):
                out = w4a16_gemm_mma(x, packed, scales, zeros, 128, cfg)
                err = ((out.float() - ref).abs().max() / scale).item()
                if err > 2e-2:
                    print(f"  WRONG {k}x{n} M={m} {cfg}: rel err {err:.3g}", flush=True)
                    continue
                t = graph_time(lambda: w4a16_gemm_mma(x, packed, scales, zeros, 128, cfg))
                if args.verbose:
                    print(f"  {k}x{n} M={m} {t * 1e3:.1f}us {cfg}", flush=True)
                if tag == "default":
                    t_default = t
                    print(f"  {k}x{n} M={m} default {cfg}: {t * 1e3:.1f}us err {err:.2g}",
                          flush=True)
                if t < best[0]:
                    best = (t, cfg)
            table.append((f"{k}x{n}", m, t_bf16, t_cur, t_default, best[0], best[1]))
            print(f"{k}x{n} M={m}: bf16 {t_bf16 * 1e3:.1f} current {t_cur * 1e3:.1f} "
                  f"interleaved dispatch {t_tl * 1e3:.1f} "
                  f"mma default {t_default * 1e3 if t_default else float('nan'):.1f} "
                  f"best {best[0] * 1e3:.1f}us {best[1]}", flush=True)
    print("\nKxN           M    bf16  current   x     mma   x     best   x")
    for shape, m, tb, tc, td, tbest, cfg in table:
        td = td or float("nan")
        print(f"{shape:12s} {m:3d} {tb * 1e3:7.1f} {tc * 1e3:7.1f} {tb / tc:5.2f} "
              f"{td * 1e3:6.1f} {tb / td:5.2f} {tbest * 1e3:6.1f} {tb / tbest:5.2f}  {cfg}")


if __name__ == "__main__":
    main()
