"""RMSNorm, fused add + RMSNorm, rotary, SiLU-and-mul, KV store: Triton against reference."""
from __future__ import annotations

import pytest
import torch

from tamis.kernels.activation import silu_and_mul, silu_and_mul_ref, silu_and_mul_triton
from tamis.kernels.cache import store_kv_cache, store_kv_cache_ref, store_kv_cache_triton
from tamis.kernels.norm import (fused_add_rms_norm, fused_add_rms_norm_ref,
                                fused_add_rms_norm_triton, rms_norm_ref, rms_norm_triton)
from tamis.kernels.rotary import rotary_embedding_ref, rotary_embedding_triton

DTYPES = [torch.float32, torch.float16]


def _tol(dtype):
    return dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 8), (5, 96), (2, 3, 100)])
def test_rms_norm(dtype, shape):
    x = torch.randn(shape, dtype=dtype) * 3
    w = torch.randn(shape[-1], dtype=dtype)
    torch.testing.assert_close(rms_norm_triton(x, w, 1e-6), rms_norm_ref(x, w, 1e-6), **_tol(dtype))


def test_rms_norm_ref_matches_transformers_formula():
    x, w = torch.randn(4, 32), torch.randn(32)
    expected = w * (x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-5))
    torch.testing.assert_close(rms_norm_ref(x, w, 1e-5), expected)


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_add_rms_norm(dtype):
    x, res = torch.randn(7, 80, dtype=dtype), torch.randn(7, 80, dtype=dtype)
    w = torch.randn(80, dtype=dtype)
    x_copy, res_copy = x.clone(), res.clone()
    out, summed = fused_add_rms_norm_triton(x, res, w, 1e-5)
    ref_out, ref_sum = fused_add_rms_norm_ref(x, res, w, 1e-5)
    torch.testing.assert_close(summed, ref_sum, atol=0, rtol=0)
    torch.testing.assert_close(out, ref_out, **_tol(dtype))
    assert torch.equal(x, x_copy) and torch.equal(res, res_copy), "inputs must not change"


def test_rms_norm_strided_rows():
    base = torch.randn(6, 128)
    x = base[:, :64]          # row stride 128, last dim contiguous
    w = torch.randn(64)
    torch.testing.assert_close(rms_norm_triton(x, w, 1e-6), rms_norm_ref(x, w, 1e-6))


def test_fused_add_rms_norm_dispatcher_on_cpu():
    x, res, w = torch.randn(3, 16), torch.randn(3, 16), torch.randn(16)
    out, summed = fused_add_rms_norm(x, res, w, 1e-6)
    torch.testing.assert_close(summed, x + res)
    torch.testing.assert_close(out, rms_norm_ref(x + res, w, 1e-6))


def test_norm_rejects_bad_weight():
    with pytest.raises(ValueError, match="weight"):
        rms_norm_triton(torch.randn(2, 8), torch.randn(7), 1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [6, 64, 1000])
def test_silu_and_mul(dtype, d):
    x = torch.randn(3, 2 * d, dtype=dtype) * 4
    torch.testing.assert_close(silu_and_mul_triton(x), silu_and_mul_ref(x), **_tol(dtype))
    torch.testing.assert_close(silu_and_mul(x), silu_and_mul_ref(x))


# Bit-exactness against transformers' formulas is checked in float16 here: Triton's CPU
# interpreter truncates float32 -> bfloat16 where the GPU rounds to nearest even. The
# gpu-marked test below repeats it in bfloat16.
def test_silu_and_mul_rounds_as_transformers(dtype=torch.float16, device="cpu"):
    """Kernel, reference and transformers' ``act_fn(gate) * up`` agree bit for bit."""
    gate = torch.randn(7, 300, dtype=dtype, device=device) * 3
    up = torch.randn(7, 300, dtype=dtype, device=device)
    x = torch.cat([gate, up], dim=-1)
    want = torch.nn.functional.silu(gate) * up
    assert torch.equal(silu_and_mul_ref(x), want)
    # The kernel's exp and torch's may differ in the last float32 bit, which can move a
    # rounding: allow a handful of such elements (rounding once differs in hundreds).
    assert (silu_and_mul_triton(x) != want).sum() <= 4


def test_silu_and_mul_odd_width_rejected():
    with pytest.raises(ValueError, match="even"):
        silu_and_mul_ref(torch.randn(2, 5))


def _inv_freq(rotary_dim, theta=10000.0):
    return 1.0 / theta ** (torch.arange(0, rotary_dim, 2).float() / rotary_dim)


def _fused_qkv(tokens, hq, hk, d, dtype):
    """q and k as strided views of one fused qkv output, as the attention layer makes them."""
    qkv = torch.randn(tokens, (hq + 2 * hk) * d, dtype=dtype)
    q = qkv[:, :hq * d].view(tokens, hq, d)
    k = qkv[:, hq * d:(hq + hk) * d].view(tokens, hk, d)
    return qkv, q, k


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("hq,hk,d,rotary_dim", [(4, 2, 16, 16), (3, 1, 32, 16), (2, 2, 8, 8)])
def test_rotary_matches_reference(dtype, is_neox, hq, hk, d, rotary_dim):
    tokens = 9
    positions = torch.randint(0, 4000, (tokens,))
    qkv, q, k = _fused_qkv(tokens, hq, hk, d, dtype)
    qkv_ref = qkv.clone()
    q_ref = qkv_ref[:, :hq * d].view(tokens, hq, d)
    k_ref = qkv_ref[:, hq * d:(hq + hk) * d].view(tokens, hk, d)
    inv_freq = _inv_freq(rotary_dim)
    rotary_embedding_ref(positions, q_ref, k_ref, inv_freq, 1.0, is_neox)
    rotary_embedding_triton(positions, q, k, inv_freq, 1.0, is_neox)
    # sin/cos of large angles differ in the last float32 bit between libm and torch.
    torch.testing.assert_close(qkv, qkv_ref, atol=2e-3 if dtype == torch.float16 else 1e-4,
                               rtol=2e-3 if dtype == torch.float16 else 1e-4)
    v_start = (hq + hk) * d
    assert torch.equal(qkv[:, v_start:], qkv_ref[:, v_start:]), "v must stay untouched"


def test_rotary_ref_matches_engine_layer():
    from tamis.engine.layers.rotary import RotaryEmbedding
    tokens, hq, hk, d = 5, 4, 2, 16
    positions = torch.randint(0, 500, (tokens,))
    q, k = torch.randn(tokens, hq, d), torch.randn(tokens, hk, d)
    inv_freq = _inv_freq(d, 500000.0)
    want_q, want_k = RotaryEmbedding(d, d, inv_freq)(positions, q.clone(), k.clone())
    got_q, got_k = rotary_embedding_ref(positions, q.clone(), k.clone(), inv_freq)
    torch.testing.assert_close(got_q, want_q)
    torch.testing.assert_close(got_k, want_k)


def test_rotary_rounds_as_transformers(dtype=torch.float16, device="cpu"):
    """Kernel and reference agree bit for bit with transformers' ``q * cos + rotate_half(q) * sin``
    (cos/sin rounded to q's dtype first, every product and sum rounded)."""
    tokens, hq, hk, d = 6, 4, 2, 32
    positions = torch.randint(0, 300, (tokens,), device=device)
    inv_freq = _inv_freq(d, 500000.0).to(device)
    qkv, q, k = _fused_qkv(tokens, hq, hk, d, dtype)
    qkv = qkv.to(device)
    q, k = qkv[:, :hq * d].view(tokens, hq, d), qkv[:, hq * d:(hq + hk) * d].view(tokens, hk, d)
    angles = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat((angles, angles), dim=-1)
    cos, sin = emb.cos().to(dtype)[:, None], emb.sin().to(dtype)[:, None]

    def hf(x):
        rotated = torch.cat((-x[..., d // 2:], x[..., :d // 2]), dim=-1)
        return x * cos + rotated * sin

    want_q, want_k = hf(q.clone()), hf(k.clone())
    ref_q, ref_k = rotary_embedding_ref(positions, q.clone(), k.clone(), inv_freq)
    assert torch.equal(ref_q, want_q) and torch.equal(ref_k, want_k)
    rotary_embedding_triton(positions, q, k, inv_freq)
    # libm and torch may differ in the last float32 bit of cos/sin of large angles, which
    # can move a bf16 rounding: allow a handful of such elements, no more.
    assert (q != want_q).sum() <= 2 and (k != want_k).sum() <= 2


def _kv_case(dtype, num_blocks=6, block_size=4, heads=2, dim=8, tokens=11):
    cache = torch.randn(2, num_blocks, block_size, heads, dim, dtype=dtype)
    kv = torch.randn(tokens, 2 * heads, dim, dtype=dtype)   # fused k|v: strided views
    key, value = kv[:, :heads], kv[:, heads:]
    slots = torch.randperm(num_blocks * block_size)[:tokens]
    slots[torch.rand(tokens) < 0.3] = -1                    # padding tokens
    slots[0] = -1
    return cache, key, value, slots


@pytest.mark.parametrize("dtype", DTYPES)
def test_store_kv_cache(dtype):
    cache, key, value, slots = _kv_case(dtype)
    expected = cache.clone()
    store_kv_cache_ref(key, value, expected, slots)
    got = cache.clone()
    store_kv_cache_triton(key, value, got, slots)
    assert torch.equal(got, expected)
    flat = got.view(2, -1, *got.shape[3:])
    for t, s in enumerate(slots.tolist()):
        if s >= 0:
            assert torch.equal(flat[0, s], key[t]) and torch.equal(flat[1, s], value[t])
    untouched = torch.ones(flat.shape[1], dtype=torch.bool)
    untouched[slots[slots >= 0]] = False
    assert torch.equal(flat[:, untouched], cache.view_as(flat)[:, untouched])


def test_store_kv_cache_dispatcher_and_errors():
    cache, key, value, slots = _kv_case(torch.float32)
    expected = cache.clone()
    store_kv_cache_ref(key, value, expected, slots)
    store_kv_cache(key, value, cache, slots)
    assert torch.equal(cache, expected)
    with pytest.raises(ValueError, match="slot_mapping"):
        store_kv_cache(key, value, cache, slots[:-1])


@pytest.mark.gpu
def test_rounding_as_transformers_in_bf16_on_gpu():
    test_silu_and_mul_rounds_as_transformers(torch.bfloat16, "cuda")
    test_rotary_rounds_as_transformers(torch.bfloat16, "cuda")


@pytest.mark.gpu
def test_elementwise_real_shapes_on_gpu():
    dev, dt = "cuda", torch.bfloat16
    x, res, w = (torch.randn(4096, 4096, device=dev, dtype=dt) for _ in range(3))
    w = w[0]
    out, summed = fused_add_rms_norm(x, res, w, 1e-5)
    ref_out, ref_sum = fused_add_rms_norm_ref(x, res, w, 1e-5)
    assert torch.equal(summed, ref_sum)
    torch.testing.assert_close(out, ref_out, atol=2e-2, rtol=2e-2)
    gu = torch.randn(4096, 2 * 14336, device=dev, dtype=dt)
    torch.testing.assert_close(silu_and_mul(gu), silu_and_mul_ref(gu), atol=2e-2, rtol=2e-2)
    positions = torch.randint(0, 8192, (4096,), device=dev)
    qkv, q, k = _fused_qkv(4096, 32, 8, 128, dt)
    qkv = qkv.to(dev)
    q, k = qkv[:, :4096].view(-1, 32, 128), qkv[:, 4096:5120].view(-1, 8, 128)
    ref = qkv.clone()
    rotary_embedding_ref(positions, ref[:, :4096].view(-1, 32, 128),
                         ref[:, 4096:5120].view(-1, 8, 128), _inv_freq(128, 500000.0).to(dev))
    rotary_embedding_triton(positions, q, k, _inv_freq(128, 500000.0).to(dev))
    torch.testing.assert_close(qkv, ref, atol=3e-2, rtol=2e-2)
    cache = torch.randn(2, 512, 16, 8, 128, device=dev, dtype=dt)
    key, value = qkv[:, 4096:5120].view(-1, 8, 128), qkv[:, 5120:].view(-1, 8, 128)
    slots = torch.randperm(512 * 16, device=dev)[:4096]
    slots[::7] = -1
    expected = cache.clone()
    store_kv_cache_ref(key, value, expected, slots)
    store_kv_cache(key, value, cache, slots)
    assert torch.equal(cache, expected)
