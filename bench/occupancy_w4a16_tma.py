"""Occupancy of the TMA W4A16 tiles as dispatched, read off sm_90 builds (no GPU needed):
for each layer and row count the tile ``pick_tma_config`` gives, its x boxes
(``x_box_rows``), the registers and stack bytes of its build with the installed Triton,
how many programs fit a multiprocessor by registers and by shared memory, and the waves
its grid makes on 132 multiprocessors (H200).

The H200 image runs Triton 3.6 while CI runs the Triton of torch's pins (3.9 in session
22), and the two allocate registers differently: run it under both (a Triton wheel
installed with ``pip install --no-deps --target DIR triton==3.6.0``, then
``PYTHONPATH=DIR``) to see what the H200 builds.

    python bench/occupancy_w4a16_tma.py [--shapes 4096x6144 ...] [--ms 65 72 ...]
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "kernels"))
from bench_quant import parse_shapes  # noqa: E402

REGISTERS_PER_SM = 65536
SHARED_PER_SM = 228 * 1024
SHARED_RESERVED_PER_PROGRAM = 1024
NUM_SMS = 132
DEFAULT_MS = [9, 16, 17, 32, 33, 48, 64, 65, 72, 96, 112, 128, 129, 200, 256]


def programs_per_sm(registers: int, threads: int, shared: int) -> tuple[int, int]:
    """(by registers, by shared memory): registers go out per thread in steps of 8."""
    by_registers = REGISTERS_PER_SM // (-(-registers // 8) * 8 * threads)
    by_shared = SHARED_PER_SM // (shared + SHARED_RESERVED_PER_PROGRAM)
    return by_registers, by_shared


def main() -> None:
    import triton
    from w4a16_sm90_builds import tma_build

    from tamis.kernels import w4a16_wgmma_tma as tma
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", help="KxN (default: all four)")
    parser.add_argument("--ms", type=int, nargs="+", default=DEFAULT_MS)
    args = parser.parse_args()
    print(f"triton {triton.__version__}")
    print("KxN           M  block  cols warps split prod maxnreg box  regs stack  "
          "per SM (regs/smem)  programs  waves")
    builds = {}
    for k, n in parse_shapes(args.shapes):
        for m in args.ms:
            if not tma.tma_dispatch(m, n):
                continue
            config = tma.pick_tma_config(m, n, k, 128)
            block_m = config.block_m or tma.tma_block_m(m)
            box = tma.x_box_rows(m, block_m, config.num_warps)
            key = (config, block_m, box)
            if key not in builds:
                builds[key] = tma_build(block_m, config, rows=m)
            build = builds[key]
            # The producer warp's partition is a warpgroup of its own (three warps idle).
            threads = 32 * (config.num_warps + (4 if config.producer_warp else 0))
            by_registers, by_shared = programs_per_sm(build.registers, threads,
                                                      tma.shared_bytes(config, block_m))
            programs = -(-m // block_m) * -(-n // config.block_n) * config.split_k
            waves = programs / (NUM_SMS * min(by_registers, by_shared))
            print(f"{k}x{n:<6} {m:4d} {block_m:5d} {config.block_n:5d} {config.num_warps:5d} "
                  f"{config.split_k:5d} {int(config.producer_warp):4d} {config.maxnreg:7d} "
                  f"{box:4d} {build.registers:5d} {build.stack_bytes:5d}  "
                  f"{by_registers:8d}/{by_shared:<8d} {programs:9d} {waves:6.2f}", flush=True)


if __name__ == "__main__":
    main()
