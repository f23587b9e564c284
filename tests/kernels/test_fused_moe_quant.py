"""Fused MoE over quantized experts: integer (W4A16 / W8A16, group-wise, act-order), FP8
per channel and in blocks (W8A16 and W8A8) and INT8 W8A8 inside the Triton grouped GEMMs,
against the reference that dequantizes one expert at a time (INT8: W8A8 on the exact
integer dot), which is checked against the format's definition."""
from __future__ import annotations

import pytest
import torch

from tamis.engine.layers.fused_moe import select_experts
from tamis.kernels.fused_moe import MoeTiles, fused_experts_ref, fused_experts_triton
from tamis.kernels.fp8_block import dequantize_block_fp8, per_token_group_quant_fp8_ref
from tamis.kernels.moe_weights import Fp8BlockExperts, Fp8Experts, Int8Experts, WNA16Experts
from tamis.quant.packing import pack_int32

HIDDEN, INTERMEDIATE = 64, 48     # I is not a multiple of the test tiles' N: edge masks run
TILES = MoeTiles(block_m=16, block_n=32, block_k=16)


def _routing(tokens: int, experts: int, top_k: int):
    return select_experts(torch.randn(tokens, experts), top_k, renormalize=True)


def _int_experts(experts: int, n: int, k: int, bits: int, group: int, act_order: bool,
                 scale_dtype=torch.float32):
    """Random codes, zero points and scales; returns (WNA16Experts, dense [E, N, K])."""
    groups = -(-k // group)
    codes = torch.randint(0, 1 << bits, (experts, k, n), dtype=torch.int32)
    zeros = torch.randint(0, 1 << bits, (experts, groups, n)).float()
    scales = (torch.rand(experts, groups, n) + 0.5) / (k ** 0.5 * (1 << bits))
    scales = scales.to(scale_dtype)
    rows = torch.arange(k) // group
    g_idx = torch.stack([rows[torch.randperm(k)] for _ in range(experts)]) if act_order else None
    group_of = g_idx.long() if act_order else rows.expand(experts, k)
    dense = torch.stack([((codes[e].float() - zeros[e][group_of[e]])
                          * scales[e][group_of[e]].float()).t() for e in range(experts)])
    qweight = torch.stack([pack_int32(codes[e], bits, dim=0) for e in range(experts)])
    weights = WNA16Experts(qweight, scales, zeros.to(scale_dtype), group, bits, k,
                           g_idx.to(torch.int32) if act_order else None)
    return weights, dense


def _int_pair(experts, bits, group, act_order, scale_dtype=torch.float32):
    w13, d13 = _int_experts(experts, 2 * INTERMEDIATE, HIDDEN, bits, min(group, HIDDEN),
                            act_order, scale_dtype)
    w2, d2 = _int_experts(experts, HIDDEN, INTERMEDIATE, bits, min(group, INTERMEDIATE),
                          act_order, scale_dtype)
    return (w13, w2), (d13, d2)


def _fp8_experts(experts: int, n: int, k: int, static: bool):
    dense = torch.randn(experts, n, k) / k ** 0.5
    scale = dense.abs().amax(dim=2) / 448.0
    codes = (dense / scale[..., None]).to(torch.float8_e4m3fn)
    input_scale = torch.tensor(0.02) if static else None
    return Fp8Experts(codes, scale, input_scale), codes.float() * scale[..., None]


@pytest.mark.parametrize("bits,group,act_order", [
    (4, 16, False), (4, 32, True), (8, 16, False), (4, 10_000, False)])
def test_reference_dequantizes_by_the_format_definition(bits, group, act_order):
    (w13, w2), (d13, d2) = _int_pair(3, bits, group, act_order)
    x = torch.randn(7, HIDDEN)
    weights, ids = _routing(7, 3, 2)
    torch.testing.assert_close(fused_experts_ref(x, w13, w2, weights, ids),
                               fused_experts_ref(x, d13, d2, weights, ids), atol=1e-5, rtol=1e-5)
    fp8_13, f13 = _fp8_experts(3, 2 * INTERMEDIATE, HIDDEN, static=False)
    fp8_2, f2 = _fp8_experts(3, HIDDEN, INTERMEDIATE, static=False)
    torch.testing.assert_close(fused_experts_ref(x, fp8_13, fp8_2, weights, ids),
                               fused_experts_ref(x, f13, f2, weights, ids), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("bits,group,act_order,tokens,tiles", [
    (4, 16, False, 13, TILES),                                   # one scale row per K tile
    (4, 32, False, 5, MoeTiles(block_m=16, block_n=16, block_k=64)),  # block_k cut to 32
    (4, 8, False, 9, TILES),                                     # groups smaller than a tile
    (4, 32, True, 11, TILES),                                    # act-order: gathered scales
    (8, 16, False, 6, TILES),                                    # W8A16
    (4, 10_000, False, 3, TILES),                                # one group over K (channel)
])
def test_int_triton_matches_reference(dtype, bits, group, act_order, tokens, tiles):
    (w13, w2), _ = _int_pair(4, bits, group, act_order,
                             torch.float16 if dtype == torch.float16 else torch.float32)
    x = torch.randn(tokens, HIDDEN).to(dtype)
    weights, ids = _routing(tokens, 4, 2)
    got = fused_experts_triton(x, w13, w2, weights, ids, tiles)
    expected = fused_experts_ref(x, w13, w2, weights, ids)
    assert got.dtype == dtype and got.shape == x.shape
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=5e-3, rtol=5e-3)
    torch.testing.assert_close(got, expected, **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_fp8_w8a16_triton_matches_reference(dtype):
    w13, _ = _fp8_experts(4, 2 * INTERMEDIATE, HIDDEN, static=False)
    w2, _ = _fp8_experts(4, HIDDEN, INTERMEDIATE, static=False)
    x = torch.randn(10, HIDDEN).to(dtype)
    weights, ids = _routing(10, 4, 2)
    got = fused_experts_triton(x, w13, w2, weights, ids, TILES, w8a8=False)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=5e-3, rtol=5e-3)
    torch.testing.assert_close(got, fused_experts_ref(x, w13, w2, weights, ids), **tol)


def _w8a8_reference(x, w13, w2, weights, ids):
    """The experts with every GEMM input rounded to FP8 as W8A8 does (per token, or by the
    static scale), on the dequantized weights: the exact computation the kernel makes."""
    def fake_quant(a, w):
        if w.input_scale is not None:
            scale = w.input_scale
        else:
            scale = (a.abs().amax(dim=1, keepdim=True) / 448.0).clamp(min=1 / (448.0 * 512))
        return (a / scale).clamp(-448, 448).to(torch.float8_e4m3fn).float() * scale

    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for weight, expert in zip(weights[t].tolist(), ids[t].tolist()):
            gate_up = fake_quant(x[t:t + 1], w13) @ w13.dense(expert).t()
            gate, up = gate_up.chunk(2, dim=1)
            hidden = torch.nn.functional.silu(gate) * up
            out[t] += weight * (fake_quant(hidden, w2) @ w2.dense(expert).t())[0]
    return out


@pytest.mark.parametrize("static", [False, True])
def test_fp8_w8a8_triton_matches_the_fp8_rounded_reference(static):
    w13, _ = _fp8_experts(4, 2 * INTERMEDIATE, HIDDEN, static)
    w2, _ = _fp8_experts(4, HIDDEN, INTERMEDIATE, static)
    x = torch.randn(10, HIDDEN)
    weights, ids = _routing(10, 4, 2)
    got = fused_experts_triton(x, w13, w2, weights, ids, TILES, w8a8=True)
    torch.testing.assert_close(got, _w8a8_reference(x, w13, w2, weights, ids),
                               atol=1e-4, rtol=1e-4)
    # and W8A8 stays close to the unrounded activations: ~5% of the norm; a static input
    # scale also clips the rows it underestimates (up to 14% in 100 random seeds)
    plain = fused_experts_ref(x, w13, w2, weights, ids)
    assert (got - plain).norm() / plain.norm() < (0.25 if static else 0.1)


# ------------------------------------------------------------------ block FP8, INT8

def _fp8_block_experts(experts: int, shards: int, shard_rows: int, k: int,
                       block: tuple[int, int]):
    """Each projection (shard) quantized in its own blocks, partial at its edges, as a
    checkpoint stores them; returns (Fp8BlockExperts, dense [E, N, K])."""
    bn, bk = block
    codes, scales = [], []
    for _ in range(experts):
        expert_codes, expert_scales = [], []
        for _ in range(shards):
            dense = torch.randn(shard_rows, k) / k ** 0.5
            blocks = torch.nn.functional.pad(dense, (0, -k % bk, 0, -shard_rows % bn))
            amax = blocks.unflatten(0, (-1, bn)).unflatten(2, (-1, bk)).abs().amax(dim=(1, 3))
            scale = amax / 448.0
            full = scale.repeat_interleave(bn, 0)[:shard_rows].repeat_interleave(bk, 1)[:, :k]
            expert_codes.append((dense / full).to(torch.float8_e4m3fn))
            expert_scales.append(scale)
        codes.append(torch.cat(expert_codes))
        scales.append(torch.cat(expert_scales))
    weights = Fp8BlockExperts(torch.stack(codes), torch.stack(scales), shard_rows, block)
    dense = torch.stack([torch.cat([dequantize_block_fp8(c, s, block, torch.float32) for c, s in
                                    zip(c.split(shard_rows), s.split(-(-shard_rows // bn)))])
                         for c, s in zip(codes, scales)])
    return weights, dense


BLOCK_HIDDEN = 80     # 2.5 blocks of 32 along K: a partial K group at the end


def _fp8_block_pair(experts: int, block: tuple[int, int]):
    w13, d13 = _fp8_block_experts(experts, 2, INTERMEDIATE, BLOCK_HIDDEN, block)
    w2, d2 = _fp8_block_experts(experts, 1, BLOCK_HIDDEN, INTERMEDIATE, block)
    return (w13, w2), (d13, d2)


def _int8_experts(experts: int, n: int, k: int):
    codes = torch.randint(-128, 128, (experts, n, k), dtype=torch.int8)
    return Int8Experts(codes, (torch.rand(experts, n) + 0.5) / (127 * k ** 0.5))


@pytest.mark.parametrize("block", [(32, 32), (128, 128)])
def test_fp8_block_reference_dequantizes_each_projection_by_its_blocks(block):
    """I = 48 is 1.5 blocks of 32: gate and up each end in a partial block of their own."""
    (w13, w2), (d13, d2) = _fp8_block_pair(3, block)
    blocks_n, blocks_k = -(-INTERMEDIATE // block[0]), -(-BLOCK_HIDDEN // block[1])
    assert w13.scale_inv.shape == (3, 2 * blocks_n, blocks_k)
    for expert in range(3):
        torch.testing.assert_close(w13.dense(expert), d13[expert], atol=0, rtol=0)
        torch.testing.assert_close(w2.dense(expert), d2[expert], atol=0, rtol=0)
    x = torch.randn(7, BLOCK_HIDDEN)
    weights, ids = _routing(7, 3, 2)
    torch.testing.assert_close(fused_experts_ref(x, w13, w2, weights, ids),
                               fused_experts_ref(x, d13, d2, weights, ids), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("block,tiles", [
    ((32, 32), TILES),                                               # two K tiles per group
    ((32, 32), MoeTiles(block_m=16, block_n=64, block_k=64)),        # block_k cut to 32
    ((128, 128), MoeTiles(block_m=16, block_n=32, block_k=128)),     # one partial group
])
def test_fp8_block_w8a16_triton_matches_reference(dtype, block, tiles):
    (w13, w2), _ = _fp8_block_pair(4, block)
    x = torch.randn(11, BLOCK_HIDDEN).to(dtype)
    weights, ids = _routing(11, 4, 2)
    got = fused_experts_triton(x, w13, w2, weights, ids, tiles, w8a8=False)
    assert got.dtype == dtype and got.shape == x.shape
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=5e-3, rtol=5e-3)
    torch.testing.assert_close(got, fused_experts_ref(x, w13, w2, weights, ids), **tol)


def _block_w8a8_reference(x, w13, w2, weights, ids):
    """The experts with every GEMM input rounded to FP8 per token and K group (the dense
    path's quantizer), on the dequantized weights."""
    def fake_quant(a, w):
        codes, scale = per_token_group_quant_fp8_ref(a, w.block[1])
        return codes.float() * scale.repeat_interleave(w.block[1], dim=1)[:, :a.shape[1]]

    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for weight, expert in zip(weights[t].tolist(), ids[t].tolist()):
            gate, up = (fake_quant(x[t:t + 1], w13) @ w13.dense(expert).t()).chunk(2, dim=1)
            hidden = torch.nn.functional.silu(gate) * up
            out[t] += weight * (fake_quant(hidden, w2) @ w2.dense(expert).t())[0]
    return out


@pytest.mark.parametrize("block", [(32, 32), (128, 128)])
def test_fp8_block_w8a8_triton_matches_the_group_rounded_reference(block):
    (w13, w2), _ = _fp8_block_pair(4, block)
    x = torch.randn(10, BLOCK_HIDDEN)
    x[:, :32] *= 20       # one K group much larger than the rest: per-group scales matter
    weights, ids = _routing(10, 4, 2)
    got = fused_experts_triton(x, w13, w2, weights, ids, TILES, w8a8=True)
    expected = _block_w8a8_reference(x, w13, w2, weights, ids)
    # An activation on an e4m3 rounding boundary may round the other way in the kernel (its
    # SiLU is not torch's to the last bit): a step of 1/16 on one element, 3e-4 of the norm
    # in the worst of 200 seeds; a wrong block scale costs percents.
    assert (got - expected).norm() / expected.norm() < 2e-3
    plain = fused_experts_ref(x, w13, w2, weights, ids)
    assert (got - plain).norm() / plain.norm() < 0.1


def test_int8_reference_is_the_w8a8_math():
    """Per-token int8 activations against the dequantized weights (``fake_quant``)."""
    w13, w2 = _int8_experts(3, 2 * INTERMEDIATE, HIDDEN), _int8_experts(3, HIDDEN, INTERMEDIATE)
    x = torch.randn(7, HIDDEN)
    weights, ids = _routing(7, 3, 2)

    def fake_quant(a):
        scale = a.abs().amax(dim=1, keepdim=True) / 127.0
        return torch.round(a / scale).clamp(-128, 127) * scale

    expected = torch.zeros_like(x)
    for t in range(7):
        for weight, expert in zip(weights[t].tolist(), ids[t].tolist()):
            gate, up = (fake_quant(x[t:t + 1]) @ w13.dense(expert).t()).chunk(2, dim=1)
            hidden = torch.nn.functional.silu(gate) * up
            expected[t] += weight * (fake_quant(hidden) @ w2.dense(expert).t())[0]
    got = fused_experts_ref(x, w13, w2, weights, ids)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    plain = fused_experts_ref(x, *(torch.stack([w.dense(e) for e in range(3)])
                                   for w in (w13, w2)), weights, ids)
    assert not torch.allclose(got, plain, atol=1e-5, rtol=1e-5)   # activations were rounded


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("tokens,tiles", [(13, TILES), (3, MoeTiles(16, 64, 32))])
def test_int8_triton_matches_reference(dtype, tokens, tiles):
    """The int8 dot accumulates exactly in int32, so only the scaled result's rounding
    (and fp16's hidden activations) can differ."""
    w13, w2 = _int8_experts(4, 2 * INTERMEDIATE, HIDDEN), _int8_experts(4, HIDDEN, INTERMEDIATE)
    x = torch.randn(tokens, HIDDEN).to(dtype)
    weights, ids = _routing(tokens, 4, 2)
    got = fused_experts_triton(x, w13, w2, weights, ids, tiles)
    assert got.dtype == dtype and got.shape == x.shape
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=5e-3, rtol=5e-3)
    torch.testing.assert_close(got, fused_experts_ref(x, w13, w2, weights, ids), **tol)


def test_mixed_forms_are_refused():
    (w13, _), (_, d2) = _int_pair(2, 4, 16, False)
    weights, ids = _routing(3, 2, 1)
    with pytest.raises(ValueError, match="one form"):
        fused_experts_ref(torch.randn(3, HIDDEN), w13, d2, weights, ids)


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 64, 700])
def test_cuda_int4_and_fp8_match_reference_at_mixtral_width(tokens):
    """Compiled kernels, default tiles, bf16, E=8 top-2, H=1024, I=3584 (Mixtral / 4)."""
    torch.manual_seed(0)
    h, i, e = 1024, 3584, 8
    x = torch.randn(tokens, h, device="cuda").bfloat16()
    weights, ids = select_experts(torch.randn(tokens, e, device="cuda"), 2, True)
    w13, _ = _int_experts(e, 2 * i, h, 4, 128, False, torch.float16)
    w2, _ = _int_experts(e, h, i, 4, 128, False, torch.float16)
    w13, w2 = (WNA16Experts(w.qweight.cuda(), w.scales.cuda(), w.zeros.cuda(), w.group_size,
                            w.bits, w.in_features) for w in (w13, w2))
    got = fused_experts_triton(x, w13, w2, weights, ids)
    torch.testing.assert_close(got, fused_experts_ref(x, w13, w2, weights, ids),
                               atol=3e-2, rtol=3e-2)
    f13, _ = _fp8_experts(e, 2 * i, h, static=False)
    f2, _ = _fp8_experts(e, h, i, static=False)
    f13, f2 = (Fp8Experts(w.weight.cuda(), w.scale.cuda()) for w in (f13, f2))
    got = fused_experts_triton(x, f13, f2, weights, ids)
    want = fused_experts_ref(x, f13, f2, weights, ids)
    assert ((got.float() - want.float()).norm() / want.float().norm()).item() < 0.05


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 64, 700])
def test_cuda_fp8_block_and_int8_match_reference_at_mixtral_width(tokens):
    """Compiled kernels, default tiles, bf16, E=8 top-2, H=1024, I=3584 (Mixtral / 4; I is
    28 whole blocks): block FP8 as W8A8 on FP8 GPUs (W8A16 elsewhere), INT8 as W8A8."""
    torch.manual_seed(0)
    h, i, e = 1024, 3584, 8
    x = torch.randn(tokens, h, device="cuda").bfloat16()
    weights, ids = select_experts(torch.randn(tokens, e, device="cuda"), 2, True)
    b13, _ = _fp8_block_experts(e, 2, i, h, (128, 128))
    b2, _ = _fp8_block_experts(e, 1, h, i, (128, 128))
    b13, b2 = (Fp8BlockExperts(w.weight.cuda(), w.scale_inv.cuda(), w.shard_rows, w.block)
               for w in (b13, b2))
    got = fused_experts_triton(x, b13, b2, weights, ids)
    want = fused_experts_ref(x, b13, b2, weights, ids)
    assert ((got.float() - want.float()).norm() / want.float().norm()).item() < 0.05
    i13, i2 = _int8_experts(e, 2 * i, h), _int8_experts(e, h, i)
    i13, i2 = (Int8Experts(w.weight.cuda(), w.scale.cuda()) for w in (i13, i2))
    got = fused_experts_triton(x, i13, i2, weights, ids)
    want = fused_experts_ref(x, i13, i2, weights, ids)
    assert ((got.float() - want.float()).norm() / want.float().norm()).item() < 0.01
