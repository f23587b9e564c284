"""FP8 W8A8 GEMMs at decode batch sizes, tamis against cuBLASLt and vLLM's CUTLASS kernel.

    python3 -P bench/bench_fp8_gemm.py [--ms 16 32 64 128 256] [--shapes 4096x6144 ...]

Per Llama-3.1-8B layer shape (K x N) and row count M, microseconds per call by CUDA-graph
replay, each call reading its own copy of the weight from DRAM (``bench_quant.cycling``):

- ``tamis``: ``kernels.fp8.fp8_linear`` as a model runs it (per-token quantization, then
  ``fp8_mm`` for ``FP8_MM_ROWS`` rows on Hopper, else ``torch._scaled_mm``);
- ``cuBLASLt``: the same quantization, then ``torch._scaled_mm`` at every M;
- ``vLLM``: its per-token quantization and ``cutlass_scaled_mm`` (vLLM importable, as after
  ``assemble`` of ``bench/device/carried.sh``; the column is left out otherwise);
- ``bf16``: ``F.linear`` on a bf16 weight of the same shape.

Each FP8 result is checked against ``fp8_linear_ref`` first (relative max error <= 2e-2).
The table comes last.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_quant import (cycling, graph_time, parse_shapes, relative_error,  # noqa: E402
                         start_on_gpu)

COPIES = 8


def vllm_ops():
    """vLLM's custom ops module, or None where vLLM is not importable."""
    try:
        from vllm import _custom_ops
    except Exception as error:   # noqa: BLE001 (any import failure: no vLLM column)
        print(f"vLLM not importable ({type(error).__name__}): no vLLM column")
        return None
    return _custom_ops


def implementations(ops):
    """name -> fn(x, weight, weight_scale) of each GEMM timed."""
    from tamis.kernels.fp8 import fp8_linear, per_token_quant_fp8

    def cublaslt(x, weight, scale):
        xq, x_scale = per_token_quant_fp8(x)
        return torch._scaled_mm(xq, weight.t(), scale_a=x_scale, scale_b=scale.reshape(1, -1),
                                out_dtype=torch.bfloat16)

    def vllm(x, weight, scale):
        xq, x_scale = ops.scaled_fp8_quant(x, None, use_per_token_if_dynamic=True)
        return ops.cutlass_scaled_mm(xq, weight.t(), x_scale, scale.reshape(-1, 1), torch.bfloat16)

    found = {"tamis": fp8_linear, "cuBLASLt": cublaslt}
    if ops is not None:
        found["vLLM"] = vllm
    return found


def time_shape(m: int, k: int, n: int, impls: dict) -> dict[str, float]:
    from tamis.kernels.fp8 import FP8_DTYPE, fp8_linear_ref
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    weights = [(torch.randn(n, k, device="cuda") * 0.05).to(FP8_DTYPE) for _ in range(COPIES)]
    scales = [torch.rand(n, device="cuda") * 0.01 + 1e-3 for _ in range(COPIES)]
    ref = fp8_linear_ref(x.float(), weights[0], scales[0])
    row = {}
    for name, fn in impls.items():
        error = relative_error(fn(x, weights[0], scales[0]).float(), ref)
        if error > 2e-2:
            raise SystemExit(f"{name} at M={m} {k}x{n}: relative error {error:.1e}")
        row[name] = 1e3 * graph_time(cycling([lambda w=w, s=s: fn(x, w, s)
                                              for w, s in zip(weights, scales)]))
    dense = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(COPIES)]
    row["bf16"] = 1e3 * graph_time(cycling([lambda w=w: F.linear(x, w) for w in dense]))
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ms", type=int, nargs="+", default=[16, 32, 64, 128, 256])
    parser.add_argument("--shapes", nargs="+", help="KxN layer shapes (default: Llama-3.1-8B's)")
    args = parser.parse_args()
    start_on_gpu()
    impls = implementations(vllm_ops())
    names = list(impls) + ["bf16"]
    rows = []
    for m in args.ms:
        for k, n in parse_shapes(args.shapes):
            row = time_shape(m, k, n, impls)
            rows.append((m, k, n, row))
            print(f"M={m} {k}x{n}: " + ", ".join(f"{key} {us:.1f} us" for key, us in row.items()),
                  flush=True)
    print("\n| M | layer | " + " | ".join(f"{name} us" for name in names)
          + " | cuBLASLt / tamis |\n|---|---|" + "---|" * (len(names) + 1))
    for m, k, n, row in rows:
        cells = " | ".join(f"{row[name]:.1f}" for name in names)
        print(f"| {m} | {k}x{n} | {cells} | {row['cuBLASLt'] / row['tamis']:.2f} |")


if __name__ == "__main__":
    main()
