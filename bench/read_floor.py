"""How fast can a kernel merely read a layer's bytes on this GPU? For each Llama-3.1-8B
layer shape: the time of a Triton kernel that reads a W4A16 layer's bytes (the words,
fp16 scales and zero points of 128-row groups) with 16-byte loads and writes one word
per program, and the same for the bf16 weight's bytes, next to bf16 ``F.linear`` at one
row, all timed as ``bench_quant.py gemm`` times (CUDA-graph replay, 16 copies cycled so
that every read comes from DRAM). The W4A16 read time bounds what any W4A16 GEMV can
reach at M = 1: bf16 time / read time is the largest speedup a kernel that only read
its bytes would show.

The W4A16 read is timed twice: launched as before, and launched as tamis's one-row GEMMs
are (programmatic dependent launch, each program letting the next grid start as it
begins, ``tamis.kernels.pdl``), so that the floor gets the same overlap of one launch
with the next as the kernel it bounds. A last column times a grid of the same programs
that reads nothing (the cost of a launch in this timing, PDL on).

    python bench/read_floor.py [--rotate 16]
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_quant import SHAPES, cycling, graph_time  # noqa: E402


@triton.jit
def _read_kernel(src_ptr, out_ptr, n_words, BLOCK: tl.constexpr, PER_PROGRAM: tl.constexpr,
                 PDL: tl.constexpr):
    """XOR of PER_PROGRAM blocks of BLOCK int32 words (so the loads are not dead); with
    PDL the next grid may start as this program begins, and the store waits for the grid
    before (the contract of ``tamis.kernels.pdl``)."""
    pid = tl.program_id(0)
    if PDL:
        gdc_launch_dependents()
    acc = tl.zeros([BLOCK], dtype=tl.int32)
    for i in tl.static_range(PER_PROGRAM):
        offs = (pid * PER_PROGRAM + i) * BLOCK + tl.arange(0, BLOCK)
        acc ^= tl.load(src_ptr + offs, mask=offs < n_words, other=0)
    if PDL:
        gdc_wait()
    tl.store(out_ptr + pid, tl.reduce(acc, 0, _xor))


@triton.jit
def _xor(a, b):
    return a ^ b


def read_all(src: torch.Tensor, out: torch.Tensor, block: int, per_program: int,
             pdl: bool = False, programs: int | None = None) -> None:
    """Read ``src`` in programs of ``per_program`` blocks; ``programs`` programs instead
    (with per_program 0: a grid that reads nothing)."""
    n = src.numel()
    grid = programs or triton.cdiv(n, block * per_program)
    _read_kernel[(grid,)](src, out, n, BLOCK=block, PER_PROGRAM=per_program, PDL=pdl,
                          num_warps=4, **({"launch_pdl": True} if pdl else {}))


def best_read_time(buffers: list[torch.Tensor], pdl: bool = False
                   ) -> tuple[float, tuple[int, int]]:
    """The fastest (ms, (block, blocks per program)) over a few shapes of the read."""
    out = torch.empty(1 << 20, dtype=torch.int32, device="cuda")
    best = (float("inf"), (0, 0))
    for block in (512, 1024, 2048):
        for per_program in (1, 2, 4, 8):
            t = graph_time(cycling([lambda b=b: read_all(b, out, block, per_program, pdl)
                                    for b in buffers]))
            best = min(best, (t, (block, per_program)))
    return best


def empty_grid_time(programs: int = 512) -> float:
    """ms of a PDL-launched grid of ``programs`` programs that read nothing."""
    src = torch.zeros(1, dtype=torch.int32, device="cuda")
    out = torch.empty(programs, dtype=torch.int32, device="cuda")
    return graph_time(lambda: read_all(src, out, 512, 0, True, programs))


def main() -> None:
    import torch.nn.functional as F
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rotate", type=int, default=16)
    args = parser.parse_args()
    print(torch.cuda.get_device_name(), flush=True)
    rows = []
    for k, n in SHAPES:
        w4_bytes = k * n // 2 + 2 * 2 * (k // 128) * n
        w4 = [torch.randint(0, 1 << 30, (w4_bytes // 4,), dtype=torch.int32, device="cuda")
              for _ in range(args.rotate)]
        weights = [torch.randn(n, k, device="cuda").to(torch.bfloat16)
                   for _ in range(args.rotate)]
        x = torch.randn(1, k, device="cuda").to(torch.bfloat16)
        t_linear = graph_time(cycling([lambda w=w: F.linear(x, w) for w in weights]))
        t_w4, cfg_w4 = best_read_time(w4)
        t_w4_pdl, cfg_pdl = best_read_time(w4, pdl=True)
        t_bf16, _ = best_read_time([w.view(torch.int32).reshape(-1) for w in weights])
        rows.append((f"{k}x{n}", w4_bytes, t_linear, t_bf16, t_w4, t_w4_pdl, cfg_w4, cfg_pdl))
        del w4, weights
    t_empty = empty_grid_time()
    print("\nus (CUDA graph, weights from DRAM); bound = bf16 F.linear / W4A16 read (PDL)")
    print("KxN          W4 MB  F.linear  bf16 read  W4 read  W4 PDL  W4 TB/s  bound  "
          "(block, per program) plain / PDL")
    for shape, nbytes, tl_, tb, tw, tp, cfg, cfg_pdl in rows:
        print(f"{shape:12s} {nbytes / 1e6:5.1f} {tl_ * 1e3:9.1f} {tb * 1e3:10.1f} "
              f"{tw * 1e3:8.1f} {tp * 1e3:7.1f} {nbytes / tp / 1e9:8.2f} {tl_ / tp:6.2f}  "
              f"{cfg} / {cfg_pdl}")
    print(f"a PDL grid of 512 programs reading nothing: {t_empty * 1e3:.2f} us")


if __name__ == "__main__":
    main()
