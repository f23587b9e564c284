"""The loop the W4A16 tile sweeps share (``sweep_w4a16_mma.py``, ``sweep_w4a16_wgmma.py``):
for each Llama-3.1-8B layer shape and M, bf16 ``F.linear`` and the current
``w4a16_gemm`` dispatch on the interleaved words a model's layers hold, then every
candidate tile of one kernel, each checked against the fp32 product with the dequantized
weight (NaN or a relative error over 2e-2 is WRONG and not timed) before it is timed by
CUDA-graph replay. The table comes last: bf16, the dispatch, the kernel's default and
its best candidate, each with bf16 time / its time.
"""
from __future__ import annotations

import argparse

import torch

from bench_quant import cycling, graph_time, interleaved_layer, parse_shapes, start_on_gpu


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Max error over the largest reference value; inf where anything is NaN."""
    if torch.isnan(out).any():
        return float("inf")
    return ((out.float() - ref).abs().max() / ref.abs().max()).item()


def run_tile_sweep(description: str, kernel, candidates, default_ms: list[int]) -> None:
    """``kernel(x, packed, scales, zeros, group_size, config)``; ``candidates(m, n, k,
    quick)`` yields (tag, config) pairs, the kernel's default first, tagged "default";
    ``quick`` is False, True (defaults only) or the name given to ``--family`` (a
    family of candidates the sweep script defines)."""
    import torch.nn.functional as F

    from tamis.kernels import w4a16
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--ms", type=int, nargs="+", default=default_ms)
    parser.add_argument("--quick", action="store_true", help="defaults only")
    parser.add_argument("--family", help="one named family of candidates (see the script)")
    parser.add_argument("--verbose", action="store_true", help="print every candidate's time")
    parser.add_argument("--rotate", type=int, default=1,
                        help="copies of each weight, cycled through by the timed calls "
                             "(16: more bytes than the L2 cache holds, as in decode)")
    parser.add_argument("--shapes", nargs="+", help="KxN (default: all four)")
    args = parser.parse_args()
    shapes = parse_shapes(args.shapes)
    start_on_gpu()
    table = []
    for k, n in shapes:
        ref_weight, copies = interleaved_layer(k, n, args.rotate)
        _, packed, scales, zeros = copies[0]
        for m in args.ms:
            x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            ref = x.float() @ ref_weight
            t_bf16 = graph_time(cycling([lambda c=c: F.linear(x, c[0]) for c in copies]))
            t_cur = graph_time(cycling([
                lambda c=c: w4a16.w4a16_gemm(x, c[1], c[2], c[3], 128, interleaved=True)
                for c in copies]))
            best, t_default = (float("inf"), None), None
            for tag, cfg in candidates(m, n, k, args.family or args.quick):
                torch.cuda.synchronize()
                try:
                    err = relative_error(kernel(x, packed, scales, zeros, 128, cfg), ref)
                except Exception as exc:  # a tile the kernel refuses (or fails to build)
                    print(f"  skip {cfg}: {exc}", flush=True)
                    continue
                if err > 2e-2:
                    print(f"  WRONG {k}x{n} M={m} {cfg}: rel err {err:.3g}", flush=True)
                    continue
                t = graph_time(cycling([
                    lambda c=c, cfg=cfg: kernel(x, c[1], c[2], c[3], 128, cfg)
                    for c in copies]))
                if args.verbose:
                    print(f"  {k}x{n} M={m} {t * 1e3:.1f}us err {err:.2g} {cfg}", flush=True)
                if tag == "default":
                    t_default = t
                if t < best[0]:
                    best = (t, cfg)
            table.append((f"{k}x{n}", m, t_bf16, t_cur, t_default or float("nan"), *best))
            print(f"{k}x{n} M={m}: bf16 {t_bf16 * 1e3:.1f} dispatch {t_cur * 1e3:.1f} "
                  f"default {table[-1][4] * 1e3:.1f} best {best[0] * 1e3:.1f}us {best[1]}",
                  flush=True)
    print(f"\n{args.rotate} weight cop{'y' if args.rotate == 1 else 'ies'}, us")
    print("KxN           M    bf16  dispatch  x  default   x     best   x")
    for shape, m, tb, tc, td, tbest, cfg in table:
        print(f"{shape:12s} {m:3d} {tb * 1e3:7.1f} {tc * 1e3:7.1f} {tb / tc:5.2f} "
              f"{td * 1e3:6.1f} {tb / td:5.2f} {tbest * 1e3:6.1f} {tb / tbest:5.2f}  {cfg}")
