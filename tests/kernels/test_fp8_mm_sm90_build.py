"""The FP8 decode GEMM (``tamis.kernels.fp8_mm``) built for sm_90 without a GPU
(``sm90_build``), with every tile set ``fp8_mm_tiles`` picks for the Llama-3.1-8B layers
over the rows it takes: it compiles with the installed Triton, its K loop runs on
Hopper's warpgroup MMA (QGMMA, e4m3 x e4m3), nothing spills, and its pipeline fits the 227 KB
of shared memory a Hopper program may ask. The GPU tests check its results."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from sm90_build import compile_sm90  # noqa: E402

from tamis.kernels import fp8_mm  # noqa: E402

SIGNATURE = {"a_ptr": "*fp8e4nv", "b_ptr": "*fp8e4nv", "out_ptr": "*bf16",
             "a_scale_ptr": "*fp32", "b_scale_ptr": "*fp32", "bias_ptr": "*bf16",
             "M": "i32", "N": "i32", "K": "i32",
             "stride_am": "i32", "stride_bn": "i32", "stride_om": "i32"}
LAYERS = [(4096, 6144), (4096, 4096), (4096, 28672), (14336, 4096)]   # (K, N)
HOPPER_SHARED_BYTES = 227 * 1024
H100_SMS = 132


def picked_tiles() -> list[fp8_mm.Fp8MmTiles]:
    return sorted({fp8_mm.fp8_mm_tiles(m, n, k, H100_SMS) for m in fp8_mm.FP8_MM_ROWS
                   for k, n in LAYERS}, key=repr)


def test_the_rows_and_layers_pick_three_tile_sets():
    assert [(t.block_n, t.block_k, t.stages) for t in picked_tiles()] == [
        (128, 128, 3), (32, 256, 5), (64, 256, 5)]


@pytest.mark.parametrize("tiles", picked_tiles(), ids=repr)
@pytest.mark.parametrize("has_bias", [False, True])
def test_each_tile_set_builds_on_the_warpgroup_mma(tiles, has_bias):
    build = compile_sm90(fp8_mm._fp8_mm_kernel, SIGNATURE,
                         dict(HAS_BIAS=has_bias, EVEN_K=True, BLOCK_M=tiles.block_m,
                              BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k,
                              STAGES=tiles.stages), tiles.num_warps)
    assert build.count("QGMMA") > 0 and "QGMMA.64x" in build.sass and ".E4M3.E4M3" in build.sass
    assert build.stack_bytes == 0, "spills"
    assert 0 < build.shared_bytes <= HOPPER_SHARED_BYTES, build.shared_bytes
