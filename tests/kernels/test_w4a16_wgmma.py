"""wgmma W4A16 kernel: tile choice and refusals (CPU), the Gluon kernel against the
reference on a Hopper GPU (``gpu``; Gluon has no interpreter)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from w4a16_cases import (KERNEL_SHAPES, assert_matches_reference,  # noqa: E402
                         assert_refused, hopper, wna16_operands)

from tamis.kernels import w4a16_wgmma  # noqa: E402
from tamis.kernels.w4a16_mma import mma_pack  # noqa: E402
from tamis.kernels.w4a16_wgmma import (SHARED_BYTES, WgmmaConfig,  # noqa: E402
                                       pick_wgmma_config, shared_bytes, w4a16_gemm_wgmma,
                                       wgmma_block_m, wgmma_dispatch)

_SHAPES = [(4096, 6144), (4096, 4096), (4096, 28672), (14336, 4096), (576, 200), (1024, 520)]


@pytest.mark.parametrize("m", [17, 32, 33, 64, 65, 128])
@pytest.mark.parametrize("k,n", _SHAPES)
def test_default_tiles_fit_in_shared_memory(m, k, n):
    config = pick_wgmma_config(m, n, k, 128)
    assert shared_bytes(config, m) <= SHARED_BYTES
    assert config.block_n % (16 * config.num_warps) == 0


def test_dispatched_for_17_to_32_rows_and_to_64_on_wide_or_deep_layers():
    assert [wgmma_dispatch(m, 28672, 4096) for m in (16, 17, 64, 65)] == \
        [False, True, True, False]
    assert [wgmma_dispatch(m, 4096, 14336) for m in (16, 17, 64, 65)] == \
        [False, True, True, False]
    assert [wgmma_dispatch(m, 4096, 4096) for m in (16, 17, 32, 33)] == \
        [False, True, True, False]


def test_steps_in_pairs_up_to_32_rows():
    assert all(pick_wgmma_config(32, n, k, 128).pairs for k, n in _SHAPES)
    assert not any(pick_wgmma_config(33, n, k, 128).pairs for k, n in _SHAPES)


def test_block_m_rounds_rows_up():
    assert [wgmma_block_m(m) for m in (1, 16, 17, 32, 33, 64, 65, 128)] == \
        [16, 16, 32, 32, 64, 64, 128, 128]


@pytest.mark.parametrize("x,config,match", [
    (torch.zeros(129, 1024, dtype=torch.bfloat16), None, "M <= 128"),
    (torch.zeros(64, 1024, dtype=torch.float16), None, "bf16 x"),
    (torch.zeros(64, 1024, dtype=torch.bfloat16), WgmmaConfig(num_warps=2), "4 or 8 warps"),
    (torch.zeros(64, 1024, dtype=torch.bfloat16), WgmmaConfig(block_n=96, num_warps=4),
     "16 columns per warp"),
    (torch.zeros(64, 1024, dtype=torch.bfloat16), WgmmaConfig(block_k=128), "divide"),
    (torch.zeros(128, 4096, dtype=torch.bfloat16), WgmmaConfig(stages=8), "shared memory"),
    (torch.zeros(64, 1024, dtype=torch.bfloat16), WgmmaConfig(stages=1), "at least 2 stages"),
    (torch.zeros(64, 1024, dtype=torch.bfloat16), WgmmaConfig(stages=2, pairs=True),
     "at least 3 stages with pairs"),
    (torch.zeros(64, 1024, dtype=torch.bfloat16), WgmmaConfig(params_ahead=3),
     "params_ahead 1 or 2"),
])
def test_bad_calls_are_refused_before_launch(x, config, match):
    if w4a16_wgmma.gluon is None:
        pytest.skip("triton without Gluon: w4a16_gemm_wgmma refuses every call")
    assert_refused(w4a16_gemm_wgmma, x, config, match, 64 if match == "divide" else 128)


_CONFIGS = [None, WgmmaConfig(64, 128, 1, 4, 4), WgmmaConfig(128, 128, 2, 8, 3),
            WgmmaConfig(128, 64, 4, 4, 6), WgmmaConfig(64, 32, 3, 4, 2),
            WgmmaConfig(256, 64, 8, 8, 3), WgmmaConfig(128, 128, 1, 4, 3),
            WgmmaConfig(64, 128, 2, 4, 3, pairs=True), WgmmaConfig(128, 64, 3, 4, 4, pairs=True),
            WgmmaConfig(64, 128, 2, 4, 3, params_ahead=1),
            WgmmaConfig(64, 128, 2, 4, 3, pairs=True, params_ahead=1)]


@pytest.mark.gpu
@pytest.mark.skipif(not hopper(), reason="wgmma needs a Hopper GPU")
@pytest.mark.parametrize("m", [17, 33, 64, 100, 128])
@pytest.mark.parametrize("k,n,group_size", KERNEL_SHAPES)
@pytest.mark.parametrize("config", range(len(_CONFIGS)))
def test_kernel_matches_reference(m, k, n, group_size, config):
    cfg = _CONFIGS[config]
    if cfg is not None and group_size < k and group_size % cfg.block_k:
        cfg = WgmmaConfig(cfg.block_n, 32, *list(cfg.__dict__.values())[2:])
    if cfg is not None and shared_bytes(cfg, m) > SHARED_BYTES:
        pytest.skip("ring over the shared memory limit (refused: tested on CPU)")
    _, qweight, scales, zeros = wna16_operands(k, n, group_size, seed=m + k + n)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(torch.bfloat16)
    got = w4a16_gemm_wgmma(x.cuda(), mma_pack(qweight.cuda(), k), scales.cuda(), zeros.cuda(),
                           group_size, cfg)
    assert_matches_reference(got, x, qweight, scales, zeros, group_size)
