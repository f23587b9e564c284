"""W4A16 dequant-GEMM: Triton kernel (interpreted on CPU, fp16/fp32) against the reference,
and the reference against an independent per-element dequantization."""
from __future__ import annotations

import os

import pytest
import torch

from tamis.kernels import w4a16, w4a16_gemv
from tamis.quant.packing import pack_int32


def _random_layout(k, n, group_size, bits, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 2**bits, (k, n), generator=gen)
    groups = -(-k // group_size)
    scales = (torch.rand(groups, n, generator=gen) * 0.02 + 0.001).to(dtype)
    zeros = torch.randint(0, 2**bits, (groups, n), generator=gen).to(dtype)
    return q, pack_int32(q, bits, dim=0), scales, zeros


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("k,group_size", [(64, 32), (96, 64), (80, 80)])
def test_reference_matches_elementwise_formula(bits, k, group_size):
    n = 24
    q, qweight, scales, zeros = _random_layout(k, n, group_size, bits, torch.float32)
    expected = torch.empty(k, n)
    for row in range(k):
        g = row // group_size
        expected[row] = (q[row].float() - zeros[g]) * scales[g]
    got = w4a16.dequantize_wna16(qweight, scales, zeros, group_size, bits, k)
    assert torch.equal(got, expected)


def _interpreted():
    return os.environ.get("TRITON_INTERPRET") == "1"


@pytest.mark.skipif(not _interpreted() and not torch.cuda.is_available(),
                    reason="Triton needs CUDA or TRITON_INTERPRET=1")
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("m,k,n,group_size,bits,config", [
    (3, 64, 48, 32, 4, w4a16.GemmConfig(16, 32, 32, 1, 4, 1)),     # aligned groups, N tail
    (5, 80, 32, 32, 4, w4a16.GemmConfig(16, 32, 32, 2, 4, 1)),     # K tail (ceil groups), split-K
    (17, 64, 32, 16, 4, w4a16.GemmConfig(16, 32, 32, 1, 4, 1)),    # group < BLOCK_K: gather path
    (4, 64, 32, 64, 8, w4a16.GemmConfig(16, 32, 32, 1, 4, 1)),     # 8-bit
    (5, 96, 48, 32, 4, w4a16.GemmConfig(16, 32, 64, 1, 4, 1)),     # K tail in a 64-row tile
    (3, 64, 32, 64, 8, w4a16.GemmConfig(16, 32, 32, 2, 4, 1)),     # 8-bit, split-K
])
def test_triton_matches_reference(dtype, m, k, n, group_size, bits, config):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    _, qweight, scales, zeros = _random_layout(k, n, group_size, bits, dtype, seed=m)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(1)).to(dtype)
    expected = w4a16.w4a16_gemm_ref(x.float(), qweight, scales.float(), zeros.float(),
                                    group_size, bits)
    got = w4a16.w4a16_gemm_triton(x.to(device), qweight.to(device), scales.to(device),
                                  zeros.to(device), group_size, bits, config=config)
    # fp32 tl.dot runs as tf32 on the GPU (exact fp32 only under the interpreter).
    tol = 2e-2 if dtype == torch.float16 or device == "cuda" else 1e-4
    torch.testing.assert_close(got.float().cpu(), expected, rtol=tol, atol=tol)


@pytest.mark.skipif(not _interpreted() and not torch.cuda.is_available(),
                    reason="Triton needs CUDA or TRITON_INTERPRET=1")
@pytest.mark.parametrize("m", [2, 40])
def test_dispatcher_tile_choice_is_correct(m):
    """The decode and mid-M tiles ``pick_config`` chooses (group 128, K tail past a group)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    k, n, group_size = 320, 64, 128
    _, qweight, scales, zeros = _random_layout(k, n, group_size, 4, torch.float16, seed=m)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(2)).half()
    expected = w4a16.w4a16_gemm_ref(x.float(), qweight, scales.float(), zeros.float(), group_size)
    got = w4a16.w4a16_gemm_triton(x.to(device), qweight.to(device), scales.to(device),
                                  zeros.to(device), group_size)
    torch.testing.assert_close(got.float().cpu(), expected, rtol=2e-2, atol=2e-2)


GEMV_CASES = [  # k, n, group_size, bits, config
    (256, 64, 128, 4, w4a16_gemv.GemvConfig(32, 16, 1)),   # one group per tile, no split
    (256, 64, 128, 4, w4a16_gemv.GemvConfig(32, 8, 2)),    # split-K reduced in-kernel
    (256, 40, 32, 4, w4a16_gemv.GemvConfig(32, 8, 4)),     # group 32 < tile: row groups
    (320, 64, 64, 4, w4a16_gemv.GemvConfig(64, 16, 2)),    # group 64 < tile, K past a group
    (200, 32, 40, 4, w4a16_gemv.GemvConfig(32, 4, 3)),     # K not a multiple of the group
    (200, 32, 200, 4, w4a16_gemv.GemvConfig(32, 8, 2)),    # one group over K (group -1)
    (96, 40, 32, 8, w4a16_gemv.GemvConfig(16, 8, 2)),      # 8-bit
]


@pytest.mark.skipif(not _interpreted() and not torch.cuda.is_available(),
                    reason="Triton needs CUDA or TRITON_INTERPRET=1")
@pytest.mark.parametrize("k,n,group_size,bits,config", GEMV_CASES)
def test_gemv_matches_reference(k, n, group_size, bits, config):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    m = 1
    _, qweight, scales, zeros = _random_layout(k, n, group_size, bits, torch.float16, seed=k + n)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(n)).to(torch.bfloat16)
    expected = w4a16.w4a16_gemm_ref(x.float(), qweight, scales.float(), zeros.float(),
                                    group_size, bits)
    got = w4a16_gemv.w4a16_gemv_triton(x.to(device), qweight.to(device), scales.to(device),
                                  zeros.to(device), group_size, bits, config=config)
    assert got.dtype == torch.bfloat16 and got.shape == (m, n)
    # Only the bf16 output rounding separates them (fp32 accumulation in both).
    tol = 8e-3 * expected.abs().max().item()
    torch.testing.assert_close(got.float().cpu(), expected, rtol=8e-3, atol=tol)


@pytest.mark.skipif(not _interpreted() and not torch.cuda.is_available(),
                    reason="Triton needs CUDA or TRITON_INTERPRET=1")
def test_gemv_split_counters_reset_between_calls():
    """The split-K counters must be back at 0 after a launch, or the next launch's
    reduction would fire early (wrong sums)."""
    from tamis.kernels.splitk import split_counters
    device = "cuda" if torch.cuda.is_available() else "cpu"
    k, n, group_size = 256, 64, 64
    _, qweight, scales, zeros = _random_layout(k, n, group_size, 4, torch.float16, seed=3)
    args = (qweight.to(device), scales.to(device), zeros.to(device), group_size, 4)
    config = w4a16_gemv.GemvConfig(32, 8, 4)
    for seed in range(3):
        x = torch.randn(1, k, generator=torch.Generator().manual_seed(seed))
        expected = w4a16.w4a16_gemm_ref(x, qweight, scales.float(), zeros.float(), group_size)
        got = w4a16_gemv.w4a16_gemv_triton(x.to(device), *args, config=config)
        torch.testing.assert_close(got.cpu(), expected, rtol=1e-4, atol=1e-4)
    assert int(split_counters(torch.device(device), 1).abs().sum()) == 0


def test_split_buffers_fresh_partials_and_zeroed_counters():
    from tamis.kernels.splitk import split_buffers
    out = torch.empty(3, 40, dtype=torch.bfloat16)
    assert all(t is out for t in split_buffers(out, 1, (3, 40), 5))
    partials, counters = split_buffers(out, 4, (3, 40), 5)
    assert partials.shape == (4, 3, 40) and partials.dtype == torch.float32
    assert counters.dtype == torch.int32 and counters.numel() >= 5
    assert int(counters.abs().sum()) == 0


def test_gemv_refuses_partial_word_groups_and_more_rows():
    assert w4a16_gemv.gemv_supported(4096, 128, 4)
    assert not w4a16_gemv.gemv_supported(4096, 12, 4)  # a group that splits a word
    assert w4a16_gemv.gemv_supported(100, 100, 4)      # ... unless it spans all of K
    qweight = torch.zeros(4096 // 8, 16, dtype=torch.int32)
    with pytest.raises(ValueError, match="one row"):
        w4a16_gemv.w4a16_gemv_triton(torch.zeros(2, 4096), qweight, torch.ones(32, 16),
                                     torch.zeros(32, 16), 128)


@pytest.mark.skipif(not _interpreted() and not torch.cuda.is_available(),
                    reason="Triton needs CUDA or TRITON_INTERPRET=1")
@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_act_order_layer_through_gemv(group_size):
    """A GPTQ act-order layer repacked by finalize_wna16 (K sorted by group), fed x
    permuted by ``wna16_perm`` as apply_wna16's CUDA path does, gives the checkpoint's
    product through the GEMV."""
    from tamis.quant import wna16
    device = "cuda" if torch.cuda.is_available() else "cpu"
    k, n, bits = 2 * group_size + 24, 48, 4   # K not a multiple of the group
    gen = torch.Generator().manual_seed(group_size)
    codes = torch.randint(0, 16, (k, n), generator=gen)
    groups = -(-k // group_size)
    g_idx = (torch.arange(k) // group_size)[torch.randperm(k, generator=gen)].int()
    scales = torch.rand(groups, n, generator=gen) * 0.02 + 0.001
    zeros = torch.randint(0, 16, (groups, n), generator=gen).float()
    layer = torch.nn.Module()
    layer.prefix = "layer"
    wna16.finalize_wna16(layer, codes, scales.half().float(), zeros, group_size, bits, g_idx)
    assert layer.wna16_perm is not None
    x = torch.randn(1, k, generator=gen)
    expected = x @ ((codes.float() - zeros[g_idx.long()]) * scales.half().float()[g_idx.long()])
    layer.to(device)
    perm = layer.wna16_perm
    got = w4a16_gemv.w4a16_gemv_triton(x.to(device)[..., perm], layer.wna16_qweight,
                                  layer.wna16_scales, layer.wna16_zeros, group_size, bits,
                                  config=w4a16_gemv.GemvConfig(16, 8, 2))
    torch.testing.assert_close(got.cpu(), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(not _interpreted() and not torch.cuda.is_available(),
                    reason="Triton needs CUDA or TRITON_INTERPRET=1")
@pytest.mark.parametrize("k,n,group_size,bits", [
    (256, 300, 128, 4),   # N tail past a 256-column tile
    (200, 64, 40, 4),     # K not a multiple of the group
    (96, 40, 12, 4),      # a group that splits a word: per-row scales
    (64, 32, 64, 8),
])
def test_dequant_kernel_matches_reference(k, n, group_size, bits):
    from tamis.kernels.wna16_dequant import dequantize_wna16_triton
    device = "cuda" if torch.cuda.is_available() else "cpu"
    _, qweight, scales, zeros = _random_layout(k, n, group_size, bits, torch.float16, seed=k)
    expected = w4a16.dequantize_wna16(qweight, scales, zeros, group_size, bits, k)
    got = dequantize_wna16_triton(qweight.to(device), scales.to(device), zeros.to(device),
                                  group_size, bits, k, torch.float32)
    assert torch.equal(got.cpu(), expected)


def test_pick_config_splits_k_only_when_columns_are_few():
    few = w4a16.pick_config(64, 4096, 4096, 128, num_sms=132)
    many = w4a16.pick_config(64, 28672, 4096, 128, num_sms=132)
    assert few.split_k > many.split_k >= 1
    assert w4a16.pick_config(16, 4096, 4096, 128, num_sms=132).split_k > 1
    assert w4a16.pick_config(2048, 4096, 4096, 128).split_k == 1
    assert w4a16_gemv.pick_gemv_config(4096, 4096, 4).split_k > 1


def test_reference_reads_interleaved_words():
    from tamis.kernels.w4a16_mma import mma_pack
    _, qweight, scales, zeros = _random_layout(64, 24, 32, 4, torch.float32, seed=3)
    expected = w4a16.dequantize_wna16(qweight, scales, zeros, 32, 4, 64)
    got = w4a16.dequantize_wna16(mma_pack(qweight, 64), scales, zeros, 32, 4, 64,
                                 interleaved=True)
    assert torch.equal(got, expected)


@pytest.mark.skipif(not _interpreted() and not torch.cuda.is_available(),
                    reason="Triton needs CUDA or TRITON_INTERPRET=1")
def test_triton_reads_interleaved_words():
    """The tl.dot and dequantize kernels on the MMA kernel's (AWQ-interleaved) words."""
    from tamis.kernels.w4a16_mma import mma_pack
    from tamis.kernels.wna16_dequant import dequantize_wna16_triton
    device = "cuda" if torch.cuda.is_available() else "cpu"
    k, n, group_size = 96, 40, 32
    _, qweight, scales, zeros = _random_layout(k, n, group_size, 4, torch.float16, seed=5)
    packed = mma_pack(qweight, k).to(device)
    x = torch.randn(3, k, generator=torch.Generator().manual_seed(4)).half()
    expected = w4a16.w4a16_gemm_ref(x.float(), qweight, scales.float(), zeros.float(), group_size)
    config = w4a16.GemmConfig(16, 32, 32, 2, 4, 1)
    got = w4a16.w4a16_gemm_triton(x.to(device), packed, scales.to(device), zeros.to(device),
                                  group_size, config=config, interleaved=True)
    torch.testing.assert_close(got.float().cpu(), expected, rtol=2e-2, atol=2e-2)
    dense = dequantize_wna16_triton(packed, scales.to(device), zeros.to(device), group_size, 4,
                                    k, torch.float32, interleaved=True)
    assert torch.equal(dense.cpu(), w4a16.dequantize_wna16(qweight, scales, zeros, group_size,
                                                           4, k))
