"""Sweep the tiles of the wgmma W4A16 kernel (``tamis.kernels.w4a16_wgmma``) at
Llama-3.1-8B layer shapes on a Hopper GPU, against bf16 ``F.linear`` and the current
``w4a16_gemm`` dispatch on the same interleaved words, in the same process
(``tile_sweep.py``: every candidate is checked against the fp32 product with the
dequantized weight, a NaN anywhere counting as wrong, before it is timed by CUDA-graph
replay, as decode runs).

    python bench/sweep_w4a16_wgmma.py [--ms 32 64 128] [--quick | --family split] [--verbose]
"""
from __future__ import annotations

import os
import sys
from dataclasses import replace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tile_sweep import run_tile_sweep  # noqa: E402


def candidates(m: int, n: int, k: int, quick: bool):
    """The default and the default with ``params_ahead`` 1 <-> 2; at M <= 16 rings of
    2-8 slots of 128-row steps on 64 or 128 columns, K split 1-16 ways; else 64 or 128
    columns on one warpgroup or 128 / 256 on two (one x^T tile in shared memory read by
    both), steps of 128 or 64 rows, K split 1, 2 or 4 ways (at least 4 steps a split),
    rings of 2-4 slots, single steps or steps in pairs (``pairs``: the second unpack
    overlapping the first wgmma), at 128-row steps also the refill after the wgmma
    (``late_refill``). Family "split": K split 2-16 ways (at least two steps a split)
    on 64 / 128 columns of one warpgroup, rings of 2 or 3 slots, single or paired steps: more programs per multiprocessor (ncu,
    session 11: the kernel issues at 7.7 cycles an instruction per warp with about two
    warps a scheduler)."""
    from tamis.kernels.w4a16_wgmma import (SHARED_BYTES, WgmmaConfig, pick_wgmma_config,
                                           shared_bytes)
    default = pick_wgmma_config(m, n, k, 128)
    yield "default", default
    if quick == "split":  # more programs per SM: K split up to 16 ways (>= 2 steps a split)
        for bn in (64, 128):
            for split in (2, 4, 8, 16):
                for stages, pairs in ((2, False), (3, False), (3, True)):
                    cfg = WgmmaConfig(bn, 128, split, 4, stages, pairs)
                    if k // split >= 2 * 128 and shared_bytes(cfg, m) <= SHARED_BYTES:
                        yield "", cfg
        return
    yield "", replace(default, params_ahead=3 - default.params_ahead)
    if quick:
        return
    if m <= 16:  # decode: deeper rings (more bytes in flight per program), more splits
        for bn in (64, 128):
            for split in (1, 2, 4, 8, 16):
                for stages, pairs in ((2, False), (3, False), (4, False), (6, False),
                                      (8, False), (4, True), (6, True)):
                    cfg = WgmmaConfig(bn, 128, split, 4, stages, pairs)
                    if k // split >= 2 * 128 and shared_bytes(cfg, m) <= SHARED_BYTES:
                        yield "", cfg
        return
    for bn, warps in ((64, 4), (128, 4), (128, 8), (256, 8)):
        for bk in (128, 64):
            for split in (1, 2, 4):
                for stages, pairs, late in ((2, False, False), (3, False, False),
                                            (4, False, False), (3, True, False),
                                            (4, True, False), (2, False, True),
                                            (3, False, True), (3, True, True)):
                    if late and bk != 128:
                        continue
                    cfg = WgmmaConfig(bn, bk, split, warps, stages, pairs, late)
                    if k // split >= 4 * bk and shared_bytes(cfg, m) <= SHARED_BYTES:
                        yield "", cfg


def main() -> None:
    from tamis.kernels.w4a16_wgmma import w4a16_gemm_wgmma
    run_tile_sweep(__doc__.splitlines()[0], w4a16_gemm_wgmma, candidates, [32, 64, 128])


if __name__ == "__main__":
    main()
