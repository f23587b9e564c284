"""Can a Triton GEMV beat cuBLAS on unquantized bf16 weights at M = 1 (W2's decode)?

    python3 -P bench/sweep_bf16_gemv.py

Runs the W8A16 GEMV kernel of ``tamis.kernels.fp8`` (which converts each weight tile to
fp32 and reduces split-K in the same launch) on bf16 weights with unit scales, over a grid
of tiles, at Llama-3.1-8B layer shapes and the LM head, against ``F.linear`` (cuBLAS; the
W2 decode-step profile shows it splitting K with a separate reduction kernel on o_proj
and down_proj). Every candidate is checked against the fp32 product first; CUDA-graph
timing (``bench_quant.graph_time``).
"""
from __future__ import annotations

import itertools
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_quant import (SHAPES, _best, _label, _rel_err, bf16_weight,  # noqa: E402
                         graph_time)

LM_HEAD = (4096, 128256)


def grid(n: int):
    from tamis.kernels.gemv import GemvTiles
    for block_n, block_k, split, stages in itertools.product(
            (8, 16, 32), (128, 256, 512), (1, 2, 4, 8), (1, 3)):
        if split == 1 or -(-n // block_n) * split <= 16 * 132:  # more never paid
            yield GemvTiles(block_n, block_k, split, 4, 3, loop_stages=stages)


def main() -> None:
    from tamis.kernels import fp8
    torch.manual_seed(0)
    rows = []
    for k, n in [*SHAPES, LM_HEAD]:
        weight = bf16_weight(k, n)
        ones = torch.ones(n, device="cuda")
        x = torch.randn(1, k, device="cuda").to(torch.bfloat16)
        ref = x.float() @ weight.float().t()
        t_cublas = graph_time(lambda: F.linear(x, weight))
        print(f"{k}x{n} M=1: cuBLAS {t_cublas * 1e3:.1f}us", flush=True)
        candidates = [(_label(c), (lambda c=c: fp8.fp8_gemv_triton(x, weight, ones, config=c)),
                       lambda got: _rel_err(got, ref)) for c in grid(n)]
        t_best, label = _best(candidates, graph_time)
        rows.append((f"{k}x{n}", t_cublas, t_best, label))
    print("\nus per GEMV at M = 1 (CUDA graph); x = cuBLAS / Triton")
    for shape, tc, tb, label in rows:
        print(f"{shape:12s} cuBLAS {tc * 1e3:6.1f} Triton {label} ({tc / tb:4.2f}x)")


if __name__ == "__main__":
    main()
