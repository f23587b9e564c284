"""One bf16 ``F.linear`` and one ``w4a16_gemm`` (interleaved words, as a model's layers
hold them) per shape and M, between cudaProfilerStart/Stop, for Nsight Compute:

    ncu --clock-control none --profile-from-start off --section SpeedOfLight \\
        --section Occupancy --section WarpStateStats --section LaunchStats \\
        python3 -P bench/ncu_w4a16.py --shapes 4096x4096 14336x4096 --ms 1 64 [--kernel wgmma]

Everything is compiled and run once before the profiled region, so only the timed
kernels (and the split-K reduction they contain) show up. ncu flushes the caches
before each profiled kernel by default: the weights come from DRAM, as in decode.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_quant import bf16_weight, w4a16_operands  # noqa: E402


def main() -> None:
    import torch.nn.functional as F

    from tamis.kernels import w4a16
    from tamis.kernels.w4a16_mma import mma_pack
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=["4096x4096"], help="KxN")
    parser.add_argument("--ms", type=int, nargs="+", default=[1])
    parser.add_argument("--kernel", choices=["dispatch", "wgmma", "mma"], default="dispatch",
                        help="the W4A16 kernel: w4a16_gemm's choice, or one forced (its"
                             " default tile)")
    args = parser.parse_args()
    torch.manual_seed(0)
    if args.kernel == "wgmma":
        from tamis.kernels.w4a16_wgmma import w4a16_gemm_wgmma as gemm
    elif args.kernel == "mma":
        from tamis.kernels.w4a16_mma import w4a16_gemm_mma as gemm
    else:
        def gemm(x, p, s, z, group):
            return w4a16.w4a16_gemm(x, p, s, z, group, interleaved=True)
    calls = []
    for shape in args.shapes:
        k, n = map(int, shape.split("x"))
        weight = bf16_weight(k, n)
        qweight, scales, zeros = w4a16_operands(k, n)
        packed = mma_pack(qweight, k)
        for m in args.ms:
            x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            calls.append((f"{shape} M={m} bf16", lambda x=x, w=weight: F.linear(x, w)))
            calls.append((f"{shape} M={m} w4a16 ({args.kernel})",
                          lambda x=x, p=packed, s=scales, z=zeros:
                          gemm(x, p, s, z, 128)))
    for _, call in calls:  # compile and warm up outside the profiled region
        call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for label, call in calls:
        print("profiling", label, flush=True)
        call()
        torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    main()
