"""The probe that measured session 16's 65..256-row figures (bench/results/quant.md), kept
as it ran (from bench/scratch/, tree of session 16 before the dispatch change): "old" is
``w4a16_gemm``'s dispatch of that tree (tl.dot below 128 rows, dequantize + cuBLAS from 128),
"tma" the TMA kernel's default tile, "tma64c" 64 columns over 2 slots. Since the dispatch
change "old" would time the TMA kernel too: ``bench/bench_w4a16_rows.py`` calls the
previous kernels by name instead."""
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench_quant import cycling, graph_time, w4a16_operands  # noqa: E402

from tamis.kernels import w4a16, w4a16_wgmma_tma as t  # noqa: E402
from tamis.kernels.w4a16_mma import mma_pack  # noqa: E402

if __name__ == "__main__":
    for k, n in [tuple(map(int, a.split('x'))) for a in os.environ.get('SHAPES', '4096x6144 4096x4096 4096x28672 14336x4096').split()]:
        weight = (torch.randn(n, k, device="cuda") * 0.02).to(torch.bfloat16)
        qw, s, z = w4a16_operands(k, n)
        packed = mma_pack(qw, k)
        ref_w = w4a16.dequantize_wna16(qw, s, z, 128, 4, k)
        copies = [(weight, packed, s, z)] + [tuple(x.clone() for x in (weight, packed, s, z)) for _ in range(15)]
        for m in [int(a) for a in os.environ.get('MS', '65 96 128 192 256').split()]:
            x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            ref = x.float() @ ref_w
            tb = graph_time(cycling([lambda c=c: F.linear(x, c[0]) for c in copies]))
            td = graph_time(cycling([lambda c=c: w4a16.w4a16_gemm(x, c[1], c[2], c[3], 128, interleaved=True) for c in copies]))
            line = f"{k}x{n} M={m} bf16 {tb*1e3:.1f} old {td*1e3:.1f} ({tb/td:.2f}x)"
            cfgs = [("tma", None)]
            if n >= 8192:
                cfgs.append(("tma64c", t.TmaConfig(64, 128, 1, 4, 2, overlap=False)))
            for tag, cfg in cfgs:
                out = t.w4a16_gemm_wgmma_tma(x, packed, s, z, 128, cfg)
                err = ((out.float() - ref).abs().max() / ref.abs().max()).item()
                tt = graph_time(cycling([lambda c=c, cfg=cfg: t.w4a16_gemm_wgmma_tma(x, c[1], c[2], c[3], 128, cfg) for c in copies]))
                line += f" | {tag} {tt*1e3:.1f} ({tb/tt:.2f}x, err {err:.3f})"
            print(line, flush=True)
