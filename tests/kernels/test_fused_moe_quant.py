"""Fused MoE over quantized experts: integer (W4A16 / W8A16, group-wise, act-order) and FP8
(W8A16 and W8A8) tiles dequantized inside the Triton grouped GEMMs, against the reference
that dequantizes one expert at a time, which is checked against the format's definition."""
from __future__ import annotations

import pytest
import torch

from tamis.engine.layers.fused_moe import select_experts
from tamis.kernels.fused_moe import MoeTiles, fused_experts_ref, fused_experts_triton
from tamis.kernels.moe_weights import Fp8Experts, WNA16Experts
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
    # and W8A8 stays close to the unrounded activations
    plain = fused_experts_ref(x, w13, w2, weights, ids)
    assert (got - plain).norm() / plain.norm() < 0.1


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
