"""Sweep the tiles of the TMA wgmma W4A16 kernel (``tamis.kernels.w4a16_wgmma_tma``) at
Llama-3.1-8B layer shapes on a Hopper GPU, against bf16 ``F.linear`` and the current
``w4a16_gemm`` dispatch on the same interleaved words, in the same process
(``tile_sweep.py``: every candidate checked against the fp32 product before it is timed
by CUDA-graph replay).

    python bench/sweep_w4a16_tma.py [--ms 32 64] [--rotate 16] [--verbose]
        [--quick | --family blocks|last|linear|producer|rows128]
"""
from __future__ import annotations

import dataclasses
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tile_sweep import run_tile_sweep  # noqa: E402


def candidates(m: int, n: int, k: int, quick: bool):
    """The default first. Up to 16 rows: 64 columns on one warpgroup or 128 on two, K
    split 2-16 ways, rings of 4 or 8 slots, the next step's unpack overlapping this
    step's wgmmas or not. Above: 64 columns on one warpgroup, 128 on one or two, K split
    1-8 ways (at least 4 steps a split), rings of 2 or 4 slots, overlapped or not; on
    narrow layers above 32 rows also 32-row blocks of x. Family "blocks": 32- against
    64-row blocks of x at K split 1, 2 or 4 ways. Family "last": above 16 rows, split K
    summed by the last split (session 14's ``last_split_reduces``; the grid above sums
    by arrival): 64 columns on one warpgroup or 128 on two, 2-8 splits, 128-row steps
    over 2 or 3 slots or 64-row steps over 4, overlapped or not, scales 1 or 2 steps
    ahead. Family "linear": the same tiles and 128 columns on one warpgroup, the
    partials in thread order (session 15's ``linear_partials``, the default above 16
    rows since; not yet swept). Family "rows128": 128-row blocks of x (the wgmma's N =
    128, each word unpacked once for twice the rows): 64 columns on one warpgroup, K
    split 1-8 ways (summed in thread order), 2 or 3 slots, overlapped or not, registers
    capped at 168 (three programs a multiprocessor) or not; 128 columns on two."""
    from tamis.kernels.w4a16_wgmma_tma import (SHARED_BYTES, TmaConfig, _sums_at_last_split,
                                               pick_tma_config, shared_bytes, tma_block_m)
    default = pick_tma_config(m, n, k, 128)
    yield "default", default
    if quick == "producer":
        yield "", dataclasses.replace(default, producer_warp=not default.producer_warp)
        for split in ((1, 2) if n >= 8192 else (2, 4, 8)):
            at_last = _sums_at_last_split(tma_block_m(m), split)
            tiles = [(128, 2, False, False)] + [  # the first: the plain kernel's tile
                (block_k, stages, overlap, True) for block_k, stages in (
                    (128, 2), (128, 3), (128, 4), (64, 4)) for overlap in (False, True)]
            for block_k, stages, overlap, producer in tiles:
                cfg = TmaConfig(64, block_k, split, 4, stages, overlap=overlap,
                                last_split_reduces=at_last, linear_partials=at_last,
                                producer_warp=producer)
                if (k // split >= 4 * 128 and cfg != default
                        and shared_bytes(cfg, tma_block_m(m)) <= SHARED_BYTES):
                    yield "", cfg
        return
    if quick == "rows128":  # above 64 rows: 128-row blocks of x against 64
        tiles = [(64, 4, split, stages, overlap, cap) for split in (1, 2, 4, 8)
                 for stages, overlap in ((2, False), (3, False), (2, True))
                 for cap in ((0, 168) if split > 1 else (0,))]
        tiles += [(128, 8, split, 2, False, 0) for split in (1, 2, 4)]
        for bn, warps, split, stages, overlap, cap in tiles:
            cfg = TmaConfig(bn, 128, split, warps, stages, overlap=overlap, block_m=128,
                            last_split_reduces=split > 1, linear_partials=split > 1,
                            maxnreg=cap)
            if k // split >= 4 * 128 and shared_bytes(cfg, 128) <= SHARED_BYTES:
                yield "", cfg
        return
    if quick == "blocks":  # narrow layers above 32 rows: 32-row blocks of x against 64
        for split in (1, 2, 4):
            for block_m in (32, 64):
                yield "", TmaConfig(64, 128, split, 4, 2, overlap=True, block_m=block_m)
        return
    if quick in ("last", "linear"):
        # 128 columns on one warpgroup only with thread order (199 registers at 8 splits:
        # 2 programs an SM, 256 programs one wave; x read from L2 half as often)
        tiles = ((64, 4), (128, 8), (128, 4)) if quick == "linear" else ((64, 4), (128, 8))
        for bn, warps in tiles:
            for split in (2, 4, 8):
                for block_k, stages in ((128, 2), (128, 3), (64, 4)):
                    for overlap, ahead in ((True, 2), (False, 2), (False, 1)):
                        cfg = TmaConfig(bn, block_k, split, warps, stages, ahead,
                                        overlap=overlap, last_split_reduces=True,
                                        linear_partials=quick == "linear")
                        if (k // split >= 4 * 128
                                and shared_bytes(cfg, tma_block_m(m)) <= SHARED_BYTES):
                            yield "", cfg
        return
    if quick:
        return
    if m <= 16:  # decode: deep rings (bytes in flight), K split up to 16 ways
        for bn, warps in ((64, 4), (128, 8)):
            for split in (2, 4, 8, 16):
                for stages, overlap in ((4, True), (8, True), (4, False), (8, False)):
                    cfg = TmaConfig(bn, 128, split, warps, stages, overlap=overlap)
                    if k // split >= 2 * 128 and shared_bytes(cfg, tma_block_m(m)) <= SHARED_BYTES:
                        yield "", cfg
        return
    for bn, warps in ((64, 4), (128, 4), (128, 8)):
        for split in (1, 2, 4, 8):
            for stages, overlap in ((2, True), (4, True), (2, False), (4, False)):
                cfg = TmaConfig(bn, 128, split, warps, stages, overlap=overlap)
                if k // split >= 4 * 128 and shared_bytes(cfg, tma_block_m(m)) <= SHARED_BYTES:
                    yield "", cfg
    if m > 32 and n < 8192:  # narrow layers: 32-row blocks of x, fewer K splits
        for split in (1, 2, 4):
            for overlap in (True, False):
                yield "", TmaConfig(64, 128, split, 4, 2, overlap=overlap, block_m=32)


def main() -> None:
    from tamis.kernels.w4a16_wgmma_tma import w4a16_gemm_wgmma_tma
    run_tile_sweep(__doc__.splitlines()[0], w4a16_gemm_wgmma_tma, candidates, [32, 64])


if __name__ == "__main__":
    main()
