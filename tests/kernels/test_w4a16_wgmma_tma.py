"""TMA wgmma W4A16 kernel: tile choice and refusals (CPU), the Gluon kernel against the
reference on a Hopper GPU (``gpu``; Gluon has no interpreter)."""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from w4a16_cases import (KERNEL_SHAPES, assert_matches_reference,  # noqa: E402
                         assert_refused, assert_sums_agree, hopper, wna16_operands)

from tamis.kernels import w4a16_wgmma_tma  # noqa: E402
from tamis.kernels.w4a16_mma import mma_pack  # noqa: E402
from tamis.kernels.w4a16_tma_tiles import (SHARED_BYTES, TmaConfig, launched_rows,  # noqa: E402
                                           pick_tma_config, shared_bytes, tma_block_m,
                                           x_box_rows)
from tamis.kernels.w4a16_wgmma_tma import (tma_dispatch, tma_supported,  # noqa: E402
                                           w4a16_gemm_wgmma_tma)

_SHAPES = [(4096, 6144), (4096, 4096), (4096, 28672), (14336, 4096), (576, 200), (1024, 520)]


@pytest.mark.parametrize("m", [17, 32, 33, 64, 65, 128, 129, 256])
@pytest.mark.parametrize("k,n", _SHAPES)
def test_default_tiles_fit_in_shared_memory(m, k, n):
    config = pick_tma_config(m, n, k, 128)
    assert shared_bytes(config, tma_block_m(m)) <= SHARED_BYTES
    assert config.block_n % (16 * config.num_warps) == 0


def test_dispatched_for_17_to_256_rows_and_from_9_on_narrow_layers():
    assert [tma_dispatch(m, 28672) for m in (1, 9, 16, 17, 32, 64, 65, 256, 257)] == \
        [False, False, False, True, True, True, True, True, False]
    assert [tma_dispatch(m, 4096) for m in (1, 8, 9, 16, 17, 64, 65, 256, 257)] == \
        [False, False, True, True, True, True, True, True, False]


@pytest.mark.parametrize("m,k,n,split,last,linear", [
    (64, 4096, 6144, 4, True, True),     # above 16 rows: the last split, thread order
    (64, 14336, 4096, 4, True, True),    # with the producer warp: 256 programs
    (32, 14336, 4096, 8, True, True),    # 111 registers: 512 programs in one wave
    (33, 4096, 4096, 4, True, True),
    (32, 4096, 4096, 4, True, True),
    (17, 14336, 4096, 8, True, True),
    (16, 14336, 4096, 8, True, True),    # up to 16 rows: 8 splits, 4 steps each at least
    (16, 4096, 4096, 8, True, True),
    (9, 4096, 6144, 8, True, True),
    (16, 1024, 4096, 2, False, False),   # 2 splits of 4 steps: by arrival
    (64, 4096, 28672, 1, False, False),  # K unsplit
])
def test_how_split_k_is_summed(m, k, n, split, last, linear):
    config = pick_tma_config(m, n, k, 128)
    assert (config.split_k, config.last_split_reduces, config.linear_partials) == \
        (split, last, linear)


@pytest.mark.parametrize("m,k,n,split,producer", [
    (64, 4096, 4096, 4, True),      # 256 programs: 1.9 a multiprocessor, two fit
    (33, 14336, 4096, 4, True),     # 8 ways halved to 4 (28 steps a split)
    (64, 4096, 6144, 4, False),     # 384 programs; halved, 192 leave SMs with one
    (32, 4096, 4096, 4, False),     # not up to 32 rows
    (64, 4096, 28672, 1, False),    # nor on wide layers
    (64, 4096, 1024, 4, False),     # 64 programs
    (128, 14336, 4096, 4, False),   # 128-row blocks: no producer warp
    (256, 4096, 4096, 2, False),
])
def test_producer_warp_where_two_programs_a_multiprocessor_fill_the_gpu(m, k, n, split,
                                                                        producer):
    config = pick_tma_config(m, n, k, 128, num_sms=132)
    assert (config.split_k, config.producer_warp) == (split, producer)


@pytest.mark.parametrize("m,n,overlap", [(64, 4096, False), (17, 6144, False),
                                         (64, 28672, True), (32, 28672, False)])
def test_unpack_overlaps_the_wgmmas_only_on_wide_layers_above_32_rows(m, n, overlap):
    assert pick_tma_config(m, n, 4096, 128).overlap == overlap


def test_launches_state_m_as_a_multiple_of_16():
    assert [launched_rows(m) for m in (1, 16, 17, 33, 64, 65, 72, 80, 100, 256)] == \
        [16, 16, 32, 48, 64, 80, 80, 80, 112, 256]


def test_block_m_rounds_rows_up():
    assert [tma_block_m(m) for m in (1, 8, 9, 16, 17, 32, 33, 64, 65, 128, 129, 256)] == \
        [8, 8, 16, 16, 32, 32, 64, 64, 128, 128, 128, 128]


def test_a_block_with_many_empty_rows_reads_two_half_boxes():
    """One box per block, except where a single block holds every row, the launched
    rows fill more than half of it and x's rows leave more than 16 of it empty (one
    warpgroup) or more than 40 (two): then two half boxes."""
    ms = (1, 9, 17, 33, 40, 48, 49, 64, 65, 72, 80, 88, 100, 104, 112, 113, 128, 129, 256)
    assert [x_box_rows(m, tma_block_m(m)) for m in ms] == \
        [8, 16, 32, 32, 32, 64, 64, 64, 64, 64, 64, 64, 64, 64, 128, 128, 128, 128, 128]
    assert [x_box_rows(m, tma_block_m(m), num_warps=8) for m in ms] == \
        [8, 16, 32, 64, 64, 64, 64, 64, 64, 64, 64, 128, 128, 128, 128, 128, 128, 128, 128]


@pytest.mark.parametrize("m,k,n,config", [
    (128, 4096, 4096, TmaConfig(64, 128, 4, 4, 2, overlap=False, block_m=128,
                                last_split_reduces=True, linear_partials=True, maxnreg=168)),
    (72, 4096, 6144, TmaConfig(64, 128, 4, 4, 2, overlap=False, block_m=128,
                               last_split_reduces=True, linear_partials=True, maxnreg=168)),
    (200, 4096, 6144, TmaConfig(64, 128, 2, 4, 2, overlap=False, block_m=128,
                                last_split_reduces=True, linear_partials=True)),
    (128, 14336, 4096, TmaConfig(64, 128, 4, 4, 2, overlap=False, block_m=128,
                                 last_split_reduces=True, linear_partials=True, maxnreg=168)),
    (256, 14336, 4096, TmaConfig(64, 128, 2, 4, 2, overlap=False, block_m=128,
                                 last_split_reduces=True, linear_partials=True)),
    (100, 4096, 28672, TmaConfig(128, 128, 1, 8, 2, overlap=False, block_m=128, maxnreg=128)),
    (72, 4096, 28672, TmaConfig(128, 128, 1, 8, 2, overlap=False, block_m=128, maxnreg=128)),
    (200, 4096, 28672, TmaConfig(64, 128, 1, 4, 2, overlap=False, block_m=128)),
    (96, 4096, 4096, TmaConfig(64, 64, 4, 4, 2, overlap=False, block_m=128,
                               last_split_reduces=True, linear_partials=True, maxnreg=168)),
])
def test_above_64_rows_blocks_of_128_rows_fill_three_programs_a_multiprocessor(m, k, n,
                                                                               config):
    group_size = 64 if config.block_k == 64 else 128
    assert pick_tma_config(m, n, k, group_size, num_sms=132) == config


def test_supported_shapes():
    assert tma_supported(64, 4096, 4096, 128) == (w4a16_wgmma_tma.gluon is not None)
    assert tma_supported(256, 4096, 4096, 128) == (w4a16_wgmma_tma.gluon is not None)
    assert not tma_supported(257, 4096, 4096, 128)
    assert not tma_supported(64, 4096, 4096, 32)    # 32-row groups: steps of 64 rows
    assert not tma_supported(64, 4096, 4128, 128)   # K % 64
    assert not tma_supported(64, 4098, 4096, 128)   # N % 4 (16-byte word rows)


@pytest.mark.parametrize("x,config,match", [
    (torch.zeros(257, 1024, dtype=torch.bfloat16), None, "1..256 rows"),
    (torch.zeros(64, 1024, dtype=torch.float16), None, "bf16 x"),
    (torch.zeros(64, 1024, dtype=torch.bfloat16), TmaConfig(num_warps=2), "4 or 8 warps"),
    (torch.zeros(64, 1024, dtype=torch.bfloat16), TmaConfig(block_n=96), "block_k 64 or 128"),
    (torch.zeros(64, 1024, dtype=torch.bfloat16), TmaConfig(block_k=128), "divide"),
    (torch.zeros(64, 4096, dtype=torch.bfloat16), TmaConfig(stages=12), "shared memory"),
    (torch.zeros(64, 1024, dtype=torch.bfloat16), TmaConfig(params_ahead=3),
     "params_ahead 1 or 2"),
    (torch.zeros(64, 1024, dtype=torch.bfloat16),
     TmaConfig(128, 64, 1, 8, 2, producer_warp=True), "producer_warp with 4 warps"),
])
def test_bad_calls_are_refused_before_launch(x, config, match):
    if w4a16_wgmma_tma.gluon is None:
        pytest.skip("triton without Gluon: w4a16_gemm_wgmma_tma refuses every call")
    assert_refused(w4a16_gemm_wgmma_tma, x, config, match, 64 if match == "divide" else 128)


_CONFIGS = [None, TmaConfig(64, 128, 1, 4, 4), TmaConfig(128, 128, 2, 8, 3),
            TmaConfig(128, 64, 4, 4, 6), TmaConfig(64, 64, 3, 4, 2),
            TmaConfig(128, 128, 1, 4, 2), TmaConfig(64, 128, 2, 4, 3, params_ahead=1)]


@pytest.mark.gpu
@pytest.mark.skipif(not hopper(), reason="wgmma needs a Hopper GPU")
@pytest.mark.parametrize("m", [1, 9, 17, 33, 64, 65, 100, 130])
@pytest.mark.parametrize("k,n,group_size", [s for s in KERNEL_SHAPES if s[2] % 64 == 0])
@pytest.mark.parametrize("config", range(len(_CONFIGS)))
def test_kernel_matches_reference(m, k, n, group_size, config):
    cfg = _CONFIGS[config]
    if cfg is not None and group_size < k and group_size % cfg.block_k:
        cfg = TmaConfig(cfg.block_n, 64, *list(cfg.__dict__.values())[2:])
    if cfg is not None and shared_bytes(cfg, tma_block_m(m)) > SHARED_BYTES:
        pytest.skip("ring over the shared memory limit (refused: tested on CPU)")
    _, qweight, scales, zeros = wna16_operands(k, n, group_size, seed=m + k + n)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(torch.bfloat16)
    got = w4a16_gemm_wgmma_tma(x.cuda(), mma_pack(qweight.cuda(), k), scales.cuda(),
                               zeros.cuda(), group_size, cfg)
    assert_matches_reference(got, x, qweight, scales, zeros, group_size)


@pytest.mark.gpu
@pytest.mark.skipif(not hopper(), reason="wgmma needs a Hopper GPU")
@pytest.mark.parametrize("m", [33, 40, 65, 72, 100, 130, 200])
@pytest.mark.parametrize("config", [TmaConfig(64, 128, 4, 4, 2, overlap=False,
                                              last_split_reduces=True, linear_partials=True),
                                    TmaConfig(64, 128, 1, 4, 2, overlap=False),
                                    TmaConfig(64, 128, 2, 4, 2, overlap=False),
                                    TmaConfig(64, 128, 4, 4, 2, overlap=False, block_m=128,
                                              last_split_reduces=True, linear_partials=True,
                                              maxnreg=168),
                                    TmaConfig(128, 128, 1, 8, 2, overlap=False, block_m=128,
                                              maxnreg=128)])
def test_overlapping_boxes_and_blocks_give_the_same_rows(m, config):
    """Above one row block the last reads the block's rows ending at the stated M (up
    to 15 past x, read as zeros) and stores only its own; one block with more rows past
    x than its tile's warps allow reads two half boxes, the second ending at the stated
    M (``x_box_rows``):
    every row bit-equal to the same row computed in a whole block (x padded to a
    multiple of the block, one box), and right."""
    k, n, group_size = 1024, 520, 128
    _, qweight, scales, zeros = wna16_operands(k, n, group_size, seed=m)
    block_m = config.block_m or 64
    padded = -(-m // block_m) * block_m
    x = torch.randn(padded, k, generator=torch.Generator().manual_seed(m)).to(torch.bfloat16)
    args = (mma_pack(qweight.cuda(), k), scales.cuda(), zeros.cuda(), group_size, config)
    got = w4a16_gemm_wgmma_tma(x[:m].cuda(), *args)
    whole = w4a16_gemm_wgmma_tma(x.cuda(), *args)
    assert torch.equal(got, whole[:m])
    assert_matches_reference(got, x[:m], qweight, scales, zeros, group_size)


@pytest.mark.gpu
@pytest.mark.skipif(not hopper(), reason="wgmma needs a Hopper GPU")
@pytest.mark.parametrize("m,split", [(32, 2), (32, 8), (64, 4), (64, 3), (64, 8), (8, 16)])
@pytest.mark.parametrize("k,n,group_size", [(4096, 4096, 128), (1024, 520, 1024)])
def test_last_split_sum_equals_the_last_arrivals_bit_for_bit(m, split, k, n, group_size):
    """The split-K sums bit-equal over back-to-back launches, and right."""
    _, qweight, scales, zeros = wna16_operands(k, n, group_size, seed=m + split)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(split)).to(torch.bfloat16)
    args = (x.cuda(), mma_pack(qweight.cuda(), k), scales.cuda(), zeros.cuda(), group_size)
    got = assert_sums_agree(w4a16_gemm_wgmma_tma, args,
                            TmaConfig(64, 128, split, 4, 2, overlap=m > 32))
    assert_matches_reference(got, x, qweight, scales, zeros, group_size)



_ROWS128_CONFIGS = [
    TmaConfig(64, 128, 4, 4, 2, overlap=False, block_m=128, last_split_reduces=True,
              linear_partials=True, maxnreg=168),
    TmaConfig(64, 128, 2, 4, 3, overlap=True, block_m=128, last_split_reduces=True,
              linear_partials=True),
    TmaConfig(64, 128, 1, 4, 2, overlap=True, block_m=128),
    TmaConfig(128, 128, 2, 8, 2, overlap=False, block_m=128, last_split_reduces=True,
              linear_partials=True),
    TmaConfig(64, 64, 3, 4, 3, overlap=False, block_m=128),
]


@pytest.mark.gpu
@pytest.mark.skipif(not hopper(), reason="wgmma needs a Hopper GPU")
@pytest.mark.parametrize("m", [65, 100, 128, 130, 256])
@pytest.mark.parametrize("k,n,group_size", [s for s in KERNEL_SHAPES if s[2] % 64 == 0])
@pytest.mark.parametrize("config", range(len(_ROWS128_CONFIGS)))
def test_128_row_blocks_match_reference(m, k, n, group_size, config):
    """x in blocks of 128 rows (the wgmma's N = 128), one block or two (the last
    overlapping), K split or not, registers capped or not."""
    cfg = _ROWS128_CONFIGS[config]
    if group_size < k and group_size % cfg.block_k:
        cfg = dataclasses.replace(cfg, block_k=64)
    _, qweight, scales, zeros = wna16_operands(k, n, group_size, seed=m + k + n)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(torch.bfloat16)
    got = w4a16_gemm_wgmma_tma(x.cuda(), mma_pack(qweight.cuda(), k), scales.cuda(),
                               zeros.cuda(), group_size, cfg)
    assert_matches_reference(got, x, qweight, scales, zeros, group_size)


_PRODUCER_CONFIGS = [
    TmaConfig(64, 128, 4, 4, 2, overlap=False, last_split_reduces=True, linear_partials=True),
    TmaConfig(64, 128, 2, 4, 3, overlap=True),
    TmaConfig(64, 128, 1, 4, 4, overlap=True),
    TmaConfig(64, 64, 3, 4, 4, params_ahead=1, overlap=False),
]


@pytest.mark.gpu
@pytest.mark.skipif(not hopper(), reason="wgmma needs a Hopper GPU")
@pytest.mark.parametrize("m", [9, 17, 33, 64])
@pytest.mark.parametrize("k,n,group_size", [s for s in KERNEL_SHAPES if s[2] % 64 == 0])
@pytest.mark.parametrize("config", range(len(_PRODUCER_CONFIGS)))
def test_producer_warp_gives_the_same_bits_as_the_kernel_without_it(m, k, n, group_size,
                                                                    config):
    """The producer warp only moves who issues the copies: the same products, bit for
    bit, over several launches (the ring's phases across steps and launches), and right."""
    cfg = _PRODUCER_CONFIGS[config]
    if group_size < k and group_size % cfg.block_k:
        cfg = dataclasses.replace(cfg, block_k=64)
    _, qweight, scales, zeros = wna16_operands(k, n, group_size, seed=m + k + n)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(torch.bfloat16)
    args = (x.cuda(), mma_pack(qweight.cuda(), k), scales.cuda(), zeros.cuda(), group_size)
    plain = w4a16_gemm_wgmma_tma(*args, cfg)
    for _ in range(3):
        got = w4a16_gemm_wgmma_tma(*args, dataclasses.replace(cfg, producer_warp=True))
        assert torch.equal(got, plain)
    assert_matches_reference(got, x, qweight, scales, zeros, group_size)
