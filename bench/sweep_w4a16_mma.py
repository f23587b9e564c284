"""Sweep the tiles of the MMA-fragment W4A16 kernel (``tamis.kernels.w4a16_mma``) at
Llama-3.1-8B layer shapes on a CUDA GPU, against bf16 ``F.linear`` and the current
``w4a16_gemm`` dispatch in the same process (``tile_sweep.py``: every candidate is checked
against the fp32 product with the dequantized weight before it is timed by CUDA-graph
replay, as decode runs).

    python bench/sweep_w4a16_mma.py [--ms 1 16 32 64] [--quick] [--verbose]
        [--family one_row | x_sums]
"""
from __future__ import annotations

import itertools
import os
import sys
from dataclasses import replace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tile_sweep import run_tile_sweep  # noqa: E402


def candidates(m: int, n: int, k: int, quick: bool):
    """The default, the default with ``params_ahead`` flipped (and ``paired_steps`` where
    it applies), then tiles around it:
    at up to 16 rows 32-256 columns on 2-8 warps, K split 2-32 ways, 1, 2 or 4 steps
    loaded together, columns permuted for vector loads or not; above 16 rows, rows of x
    split over 2 or 4 warps, or x staged in shared memory."""
    from tamis.kernels.w4a16_mma import MmaConfig, pick_mma_config
    default = pick_mma_config(m, n, k, 128)
    yield "default", default
    yield "", replace(default, params_ahead=not default.params_ahead)
    if default.params_ahead and default.load_steps == 1:
        yield "", replace(default, paired_steps=not default.paired_steps)
    if quick in ("one_row", "x_sums"):  # the one-row loop (words, x and parameters a load
        # ahead, steps in pairs) over tile widths, warps and K splits; 16 splits and more
        # summed by the last; "x_sums": zero points by sums of x, and the default without
        by_sums = quick == "x_sums"
        if by_sums:
            yield "", replace(default, zeros_by_x_sums=not default.zeros_by_x_sums)
        for (bn, warps), split in itertools.product(
                ((64, 2), (128, 4), (128, 8), (256, 8)), (8, 16, 32)):
            yield "", MmaConfig(bn, 128, split, warps, params_ahead=True, paired_steps=True,
                                last_split_reduces=split >= 16, zeros_by_x_sums=by_sums)
        return
    if quick:
        return
    if m <= 16:
        for bn, warps in ((64, 2), (128, 2), (128, 4), (128, 8), (256, 8)):
            for split in (4, 8, 16):
                for steps in (1, 2):
                    for vector in (True, False):
                        yield "", MmaConfig(bn, 128, split, warps, load_steps=steps,
                                            vector_columns=vector)
        for bn, warps in ((64, 2), (128, 4), (128, 8)):
            for split in (2, 4, 8, 16):
                yield "", MmaConfig(bn, 128, split, warps, load_steps=4)
        for bn, warps in ((32, 2), (64, 4)):  # more, smaller programs
            for split in (8, 16, 32):
                yield "", MmaConfig(bn, 128, split, warps, load_steps=2)
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
    from tamis.kernels.w4a16_mma import w4a16_gemm_mma
    run_tile_sweep(__doc__.splitlines()[0], w4a16_gemm_mma, candidates, [1, 16, 32, 64])


if __name__ == "__main__":
    main()
