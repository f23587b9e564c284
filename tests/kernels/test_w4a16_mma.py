"""MMA-fragment W4A16 kernel: the stored layout (CPU) and the Gluon kernel against the
reference (GPU; Gluon has no interpreter)."""
from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from w4a16_cases import KERNEL_SHAPES, assert_matches_reference, assert_sums_agree  # noqa: E402
from w4a16_cases import wna16_operands as _operands  # noqa: E402

from tamis.kernels import w4a16_mma, w4a16_mma_tiles  # noqa: E402
from tamis.kernels.w4a16_common import step_rows  # noqa: E402
from tamis.kernels.w4a16_mma import (mma_layout_supported, mma_pack, mma_supported,  # noqa: E402
                                     mma_unpack, w4a16_gemm_mma)
from tamis.kernels.w4a16_mma_tiles import (MmaConfig, one_wave_split,  # noqa: E402
                                           pick_mma_config, split_one_row_config)


def test_pack_interleaves_each_word_like_awq():
    word = torch.tensor([[0x76543210]], dtype=torch.int32)   # code j = j
    assert mma_pack(word.repeat(4, 1), 32)[0, 0].item() == 0x75316420


@pytest.mark.parametrize("k", [32, 576, 1024])
def test_pack_then_unpack_gives_the_codes(k):
    codes, qweight, _, _ = _operands(k, 24, 32, seed=k)
    packed = mma_pack(qweight, k)
    assert packed.shape == qweight.shape and packed.dtype == torch.int32
    assert torch.equal(mma_unpack(packed, k), codes.to(torch.int32))


def test_pack_refuses_k_not_a_multiple_of_32():
    _, qweight, _, _ = _operands(40, 8, 8, seed=0)
    with pytest.raises(ValueError, match="K % 32"):
        mma_pack(qweight, 40)


def test_supported_cases():
    x = torch.zeros(16, 576, dtype=torch.bfloat16)
    assert mma_supported(x, 576, 64, 4) == (mma_supported.__globals__["gluon"] is not None)
    assert not mma_supported(x.half(), 576, 64, 4)
    assert not mma_supported(x, 576, 64, 8)
    assert not mma_supported(x, 576, 48, 4)
    assert not mma_supported(torch.zeros(65, 576, dtype=torch.bfloat16), 576, 64, 4)


def test_layout_needs_integer_zero_points_in_range():
    gluon = mma_supported.__globals__["gluon"] is not None
    zeros = torch.tensor([[0.0, 8.0, 16.0]])
    assert mma_layout_supported(576, 64, 4, zeros) == gluon
    assert not mma_layout_supported(576, 64, 4, zeros + 0.5)
    assert not mma_layout_supported(576, 64, 4, zeros + 1)      # 17
    assert not mma_layout_supported(576, 64, 8, zeros)
    assert not mma_layout_supported(40, 40, 4, zeros)           # K % 32


@pytest.mark.parametrize("config,match", [
    (MmaConfig(load_steps=4), "load_steps 1 or 2"),
    # K = 128 in 8 chunks: 16 rows a chunk, not whole steps
    (MmaConfig(32, 128, 1, 8, params_ahead=True, paired_steps=True, k_chunks=8),
     r"clash: \['chunk rows'\]"),
    (MmaConfig(32, 32, 2, 8, k_chunks=2), r"clash: \['params_ahead', 'split_k'\]"),
    # K = 128 in 2 chunks of one 64-row step: a load of two steps does not fit one
    (MmaConfig(32, 64, 1, 8, params_ahead=True, load_steps=2, k_chunks=2),
     r"clash: \['chunk rows'\]"),
    (MmaConfig(32, 32, 1, 8, params_ahead=True, paired_steps=True, k_chunks=3),
     r"clash: \['k_chunks', 'chunk rows'\]"),
    (MmaConfig(32, 32, 1, 8, params_ahead=True, paired_steps=True, k_chunks=32),
     r"clash: \['k_chunks', 'chunk rows'\]"),
    (MmaConfig(whole_wave=True), "whole_wave pads the grid of k_chunks tiles only"),
    (MmaConfig(steps_up_front=True), "steps_up_front takes a k_chunks tile"),
    # K = 128 in 2 chunks of two 32-row steps: not 4 steps a chunk
    (MmaConfig(32, 32, 1, 8, params_ahead=True, paired_steps=True, k_chunks=2,
               steps_up_front=True), "chunks of 64 rows")])
def test_unsupported_config_is_refused_before_launch(config, match):
    if w4a16_mma.gluon is None:
        pytest.skip("triton without Gluon: w4a16_gemm_mma refuses every call")
    x = torch.zeros(1, 128, dtype=torch.bfloat16)
    packed = torch.zeros(16, 16, dtype=torch.int32)
    scales, zeros = torch.ones(1, 16), torch.zeros(1, 16)
    with pytest.raises(ValueError, match=match):
        w4a16_gemm_mma(x, packed, scales, zeros, 128, config)


_CONFIGS = [None, MmaConfig(128, 64, 1, 8, 16), MmaConfig(64, 32, 3, 2, 64),
            MmaConfig(64, 64, 1, 2, 64), MmaConfig(256, 32, 3, 8, 8),
            MmaConfig(32, 128, 8, 1), MmaConfig(128, 64, 4, 2, 32),
            MmaConfig(64, 128, 3, 2, load_steps=2),
            MmaConfig(128, 128, 4, 8, vector_columns=False),
            MmaConfig(128, 64, 3, 4, params_ahead=True),
            MmaConfig(64, 128, 3, 2, load_steps=2, params_ahead=True),
            # steps in pairs: an even and an odd number of steps a split, and tails
            MmaConfig(128, 128, 8, 4, params_ahead=True, paired_steps=True),
            MmaConfig(128, 64, 3, 4, params_ahead=True, paired_steps=True),
            MmaConfig(64, 32, 5, 2, params_ahead=True, paired_steps=True),
            # 2..8 rows on deep layers: a load ahead on 8 warps
            MmaConfig(128, 128, 8, 8, vector_columns=False, params_ahead=True)]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="Gluon kernels need a CUDA GPU")
@pytest.mark.parametrize("m", [1, 5, 16, 33, 64])
@pytest.mark.parametrize("k,n,group_size", KERNEL_SHAPES)
@pytest.mark.parametrize("config", range(len(_CONFIGS)))
def test_kernel_matches_reference(m, k, n, group_size, config):
    cfg = _CONFIGS[config]
    if cfg is not None and group_size < k and group_size % cfg.block_k:
        cfg = replace(cfg, block_k=32)
    _, qweight, scales, zeros = _operands(k, n, group_size, seed=m + k + n)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(torch.bfloat16)
    got = w4a16_gemm_mma(x.cuda(), mma_pack(qweight.cuda(), k), scales.cuda(), zeros.cuda(),
                         group_size, cfg)
    assert_matches_reference(got, x, qweight, scales, zeros, group_size)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="Gluon kernels need a CUDA GPU")
@pytest.mark.parametrize("split", [2, 3, 16])
@pytest.mark.parametrize("k,n,group_size", KERNEL_SHAPES)
def test_last_split_sum_equals_the_last_arrivals_bit_for_bit(split, k, n, group_size):
    """The split-K sums bit-equal over back-to-back launches, and right."""
    _, qweight, scales, zeros = _operands(k, n, group_size, seed=k + n + split)
    x = torch.randn(1, k, generator=torch.Generator().manual_seed(split)).to(torch.bfloat16)
    args = (x.cuda(), mma_pack(qweight.cuda(), k), scales.cuda(), zeros.cuda(), group_size)
    got = assert_sums_agree(w4a16_gemm_mma, args,
                            MmaConfig(128, step_rows(k, group_size), split, 4,
                                      params_ahead=True, paired_steps=True))
    assert_matches_reference(got, x, qweight, scales, zeros, group_size)


@pytest.mark.parametrize("blocks,warps,k,expected", [
    (32, 4, 4096, 16),    # 4096 x 4096: 512 programs of the 528 that fit
    (48, 4, 4096, 8),     # 4096 x 6144: 16 ways would make 768
    (16, 8, 14336, 16),   # 14336 x 4096: 2 programs of 8 warps a multiprocessor
    (448, 2, 4096, 2),    # 4096 x 28672
    (5, 4, 576, 2),       # two steps a split at least
])
def test_one_wave_split(blocks, warps, k, expected):
    assert one_wave_split(blocks, warps, k, 128, 132) == expected


@pytest.mark.parametrize("n,k,group_size,num_sms,chunked,padded", [
    (6144, 4096, 128, 132, True, False),    # 192 programs: every multiprocessor, one wave
    (4096, 4096, 128, 132, True, True),     # 128 programs: padded to 132
    (4096, 4096, 128, 114, True, False),    # ... but 114 multiprocessors all busy
    (3584, 4096, 128, 132, False, False),   # 112 programs: under 7/8 of them
    (3712, 4096, 128, 132, True, True),     # 116 programs: 7/8 of them, padded
    (28672, 4096, 128, 132, False, False),  # wide
    (4096, 14336, 128, 132, False, False),  # deep
    (4608, 3584, 128, 132, False, False),   # eighths of K (448 rows) not whole steps
    (6144, 4096, 1024, 132, False, False),  # eighths of K inside one group
    (6144, 4096, 4096, 132, True, False),   # one group for all of K
])
def test_one_row_sums_k_in_the_program_where_its_programs_fill_one_wave(
        n, k, group_size, num_sms, chunked, padded):
    config = pick_mma_config(1, n, k, group_size, num_sms)
    assert bool(config.k_chunks) == chunked
    assert config.whole_wave == padded
    if chunked:
        assert (config.split_k, config.block_n, config.num_warps) == (1, 32, 8)
    else:
        assert config == split_one_row_config(n, k, group_size, num_sms)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="Gluon kernels need a CUDA GPU")
@pytest.mark.parametrize("m", [1, 3])
def test_fp32_scales_and_zero_points_match_the_reference(m):
    """Layers keep fp32 scales and zero points where fp16 would round the scales
    (``quant.wna16``); the kernel turns the zero points into bf16 through fp16."""
    k, n, group_size = 1024, 520, 128
    _, qweight, scales, zeros = _operands(k, n, group_size, seed=11 + m)
    scales, zeros = scales.float() * 1.0001, zeros.float()
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(torch.bfloat16)
    got = w4a16_gemm_mma(x.cuda(), mma_pack(qweight.cuda(), k), scales.cuda(), zeros.cuda(),
                         group_size)
    assert_matches_reference(got, x, qweight, scales, zeros, group_size)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="Gluon kernels need a CUDA GPU")
def test_x_at_an_odd_element_offset_matches_the_reference():
    """The one-row loop reads x as bf16 pairs: x starting 2 bytes into its storage is
    copied first, not read misaligned."""
    k, n, group_size = 1024, 520, 128
    _, qweight, scales, zeros = _operands(k, n, group_size, seed=5)
    storage = torch.randn(k + 1, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    x = storage.cuda()[1:].view(1, k)
    assert x.data_ptr() % 4 == 2
    got = w4a16_gemm_mma(x, mma_pack(qweight.cuda(), k), scales.cuda(), zeros.cuda(),
                         group_size)
    assert_matches_reference(got, x.cpu(), qweight, scales, zeros, group_size)


# The paired tiles of _CONFIGS and the deep layers' default, by sums of x.
_BY_SUMS = [replace(c, zeros_by_x_sums=True)
            for c in _CONFIGS + [MmaConfig(256, 128, 16, 8, params_ahead=True,
                                           paired_steps=True, last_split_reduces=True)]
            if c is not None and c.paired_steps]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="Gluon kernels need a CUDA GPU")
@pytest.mark.parametrize("m", [1, 3, 16, 33])
@pytest.mark.parametrize("k,n,group_size", KERNEL_SHAPES)
@pytest.mark.parametrize("config", range(len(_BY_SUMS)))
def test_zero_points_by_x_sums_match_the_reference(m, k, n, group_size, config):
    """Codes unpacked as 128 + q and (128 + z) times each step's sum of x taken off the
    product: the result of the zero point applied per word, within bf16 rounding (rows
    of x summed per program, up to 16 rows in a program, splits of 1-7 steps, odd and
    even, groups of 32 rows to all of K)."""
    cfg = _BY_SUMS[config]
    if group_size < k and group_size % cfg.block_k:
        cfg = replace(cfg, block_k=32)
    _, qweight, scales, zeros = _operands(k, n, group_size, seed=3 * m + k + n)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(torch.bfloat16)
    args = (x.cuda(), mma_pack(qweight.cuda(), k), scales.cuda(), zeros.cuda(), group_size)
    got = w4a16_gemm_mma(*args, cfg)
    assert_matches_reference(got, x, qweight, scales, zeros, group_size)
    per_word = w4a16_gemm_mma(*args, replace(cfg, zeros_by_x_sums=False))
    # Both round the same sums (up to fp32 rounding) to bf16: one bf16 step apart at
    # most, or a thousandth of the largest output near 0.
    floor = per_word.float().abs().max() * 1e-3
    step = (per_word.float().abs() * 2.0 ** -7).clamp_min(floor)
    assert ((got.float() - per_word.float()).abs() <= step).all()


def _paired_chunks(block_n: int, block_k: int, warps: int, chunks: int, **fields) -> MmaConfig:
    """A one-split chunked tile on the paired loop (a load ahead, steps in pairs)."""
    return MmaConfig(block_n, block_k, 1, warps, params_ahead=True, paired_steps=True,
                     k_chunks=chunks, **fields)


_CHUNKED = [(4096, 4096, 128, _paired_chunks(32, 128, 8, 8)),
            (4096, 4096, 128, _paired_chunks(16, 128, 4, 8)),
            (4096, 4096, 128, _paired_chunks(64, 128, 4, 2)),
            # one step a chunk (the paired loop's odd tail), one group for all of K,
            # columns past N
            (1024, 520, 1024, _paired_chunks(32, 128, 8, 8)),
            # 9 steps of 32-row groups a chunk, the second chunk 9 groups on
            (576, 136, 32, _paired_chunks(32, 32, 4, 2)),
            # two steps a load, a load ahead (4 steps a chunk: all of them in flight at
            # once; 2 steps; 4 steps of 64-row groups with 32 columns past N)
            (4096, 4096, 128, MmaConfig(32, 128, 1, 8, params_ahead=True, load_steps=2,
                                        k_chunks=8)),
            (2048, 4096, 128, MmaConfig(32, 128, 1, 8, params_ahead=True, load_steps=2,
                                        k_chunks=8)),
            (2048, 4080, 64, MmaConfig(32, 64, 1, 8, params_ahead=True, load_steps=2,
                                       k_chunks=8)),
            # one step a load, unpaired
            (4096, 4096, 128, MmaConfig(32, 128, 1, 8, params_ahead=True, k_chunks=8)),
            # the 4 steps of each chunk loaded up front (the narrow layers' default), with
            # columns past N, 64-row groups, zero points by sums of x
            (4096, 4096, 128, _paired_chunks(32, 128, 8, 8, steps_up_front=True,
                                             max_registers=120)),
            (4096, 520, 128, _paired_chunks(32, 128, 8, 8, steps_up_front=True,
                                            max_registers=120)),
            (2048, 136, 64, _paired_chunks(32, 64, 8, 8, steps_up_front=True,
                                           max_registers=120)),
            (4096, 4096, 128, _paired_chunks(32, 128, 8, 8, steps_up_front=True,
                                             zeros_by_x_sums=True)),
            # zero points by sums of x, each chunk's sums its column's
            (4096, 4096, 128, _paired_chunks(32, 128, 8, 8, zeros_by_x_sums=True)),
            (576, 136, 32, _paired_chunks(32, 32, 4, 2, zeros_by_x_sums=True)),
            # 16 chunks in two n8 blocks of x^T's columns (2 steps a chunk; one step a
            # chunk with columns past N; 16 warps of one m16; sums of x)
            (4096, 4096, 128, _paired_chunks(16, 128, 8, 16)),
            (2048, 520, 128, _paired_chunks(16, 128, 8, 16)),
            (4096, 4096, 128, _paired_chunks(32, 128, 16, 16)),
            (4096, 4096, 128, _paired_chunks(16, 128, 8, 16, zeros_by_x_sums=True))]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="Gluon kernels need a CUDA GPU")
@pytest.mark.parametrize("case", range(len(_CHUNKED)))
def test_chunks_of_k_in_the_columns_of_x_match_the_reference(case):
    """k_chunks: the one row's chunks of K in the MMA's columns of x, each tile row's
    words from its chunk (in registers a step ahead, or all in shared memory), the
    chunks summed per column in the program."""
    k, n, group_size, config = _CHUNKED[case]
    _, qweight, scales, zeros = _operands(k, n, group_size, seed=k + n + case)
    x = torch.randn(1, k, generator=torch.Generator().manual_seed(case)).to(torch.bfloat16)
    got = w4a16_gemm_mma(x.cuda(), mma_pack(qweight.cuda(), k), scales.cuda(), zeros.cuda(),
                         group_size, config)
    assert_matches_reference(got, x, qweight, scales, zeros, group_size)


@pytest.mark.parametrize("blocks,num_sms,whole_wave,programs", [
    (128, 132, True, 132), (192, 132, True, 264), (17, 132, True, 132), (264, 132, True, 264),
    (128, 132, False, 128)])
def test_whole_wave_rounds_the_grid_up_to_whole_multiprocessors(blocks, num_sms, whole_wave,
                                                                 programs):
    config = _paired_chunks(32, 128, 8, 8, whole_wave=whole_wave)
    assert w4a16_mma_tiles.whole_wave_programs(config, blocks, num_sms) == programs


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="Gluon kernels need a CUDA GPU")
@pytest.mark.parametrize("k,n,group_size,config", [
    (4096, 4096, 128, _paired_chunks(32, 128, 8, 8)),
    (1024, 520, 1024, _paired_chunks(32, 128, 8, 8)),
    (576, 136, 32, _paired_chunks(32, 32, 4, 2))])
def test_whole_wave_padding_leaves_the_chunked_product_unchanged(k, n, group_size, config):
    """``whole_wave``: the chunked grid padded to whole multiprocessors (the extra
    programs repeat earlier tiles and store nothing) gives the unpadded grid's output
    bit for bit and matches the reference in every column."""
    _, qweight, scales, zeros = _operands(k, n, group_size, seed=k + n)
    x = torch.randn(1, k, generator=torch.Generator().manual_seed(n)).to(torch.bfloat16).cuda()
    packed = mma_pack(qweight.cuda(), k)
    plain = w4a16_gemm_mma(x, packed, scales.cuda(), zeros.cuda(), group_size, config)
    padded = w4a16_gemm_mma(x, packed, scales.cuda(), zeros.cuda(), group_size,
                            replace(config, whole_wave=True))
    assert torch.equal(padded, plain)
    assert_matches_reference(padded, x.cpu(), qweight, scales, zeros, group_size)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="Gluon kernels need a CUDA GPU")
@pytest.mark.parametrize("k,group_size", [(1024, 128), (2048, 64)])
def test_one_row_default_sums_k_in_the_program_where_it_fills_one_wave(k, group_size):
    """The default one-row launch on a layer whose 32-column programs fill this GPU's
    multiprocessors in one wave (1.5 programs a multiprocessor, ragged N) takes the
    chunked tile and matches the reference."""
    from tamis.kernels.splitk import sm_count
    sms = sm_count(torch.empty(0, device="cuda"))
    n = 48 * sms + 8
    assert pick_mma_config(1, n, k, group_size, sms).k_chunks
    _, qweight, scales, zeros = _operands(k, n, group_size, seed=n)
    x = torch.randn(1, k, generator=torch.Generator().manual_seed(k)).to(torch.bfloat16)
    got = w4a16_gemm_mma(x.cuda(), mma_pack(qweight.cuda(), k), scales.cuda(), zeros.cuda(),
                         group_size)
    assert_matches_reference(got, x, qweight, scales, zeros, group_size)


def test_sums_of_x_need_the_rows_a_split_takes():
    """The by-sums build sizes its shared sums by the split's steps: built without the
    split's rows it refuses rather than build too few."""
    config = MmaConfig(128, 128, 8, 4, params_ahead=True, paired_steps=True,
                       zeros_by_x_sums=True)
    with pytest.raises(ValueError, match="k_split"):
        w4a16_mma.mma_constexprs(config, 8, 128, 8, True)
    assert w4a16_mma.mma_constexprs(config, 8, 128, 8, True, k_split=896)["SUM_STEPS"] == 8
