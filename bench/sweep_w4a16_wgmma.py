"""Sweep the tiles of the wgmma W4A16 kernel (``tamis.kernels.w4a16_wgmma``) at
Llama-3.1-8B layer shapes on a Hopper GPU, against bf16 ``F.linear`` and the current
``w4a16_gemm`` dispatch on the same interleaved words, in the same process
(``tile_sweep.py``: every candidate is checked against the fp32 product with the
dequantized weight, a NaN anywhere counting as wrong, before it is timed by CUDA-graph
replay, as decode runs).

    python bench/sweep_w4a16_wgmma.py [--ms 32 64 128] [--quick] [--verbose]
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tile_sweep import run_tile_sweep  # noqa: E402


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


def main() -> None:
    from tamis.kernels.w4a16_wgmma import w4a16_gemm_wgmma
    run_tile_sweep(__doc__.splitlines()[0], w4a16_gemm_wgmma, candidates, [32, 64, 128])


if __name__ == "__main__":
    main()
