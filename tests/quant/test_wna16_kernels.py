"""The W4A16 kernel of a layer is chosen once, at load (``tamis.quant.wna16_kernels``):
the reference on the CPU, the interleaved tensor-core family for bf16 on a capable GPU,
the canonical family otherwise; the forward path only calls it."""
from __future__ import annotations

import pytest
import torch

from formats import load_layer, make_layer, pack_along_cols, pack_along_rows
from tamis.quant import wna16, wna16_kernels
from tamis.quant.awq import AWQConfig
from tamis.quant.gptq import GPTQConfig
from tamis.quant.packing import pack_awq
from tamis.quant.wna16_kernels import (CanonicalWordsKernel, InterleavedWordsKernel,
                                       ReferenceKernel, WNA16Spec, choose_wna16_kernel,
                                       dequantized_weight)

K, N, GROUP = 64, 32, 32


def _awq_layer(gen):
    layer = make_layer(AWQConfig(group_size=GROUP), K, [N], prefix="model.layers.0.mlp.up")
    load_layer(layer, {
        ("qweight", None): pack_awq(torch.randint(0, 16, (K, N), generator=gen)),
        ("qzeros", None): pack_awq(torch.randint(0, 16, (K // GROUP, N), generator=gen)),
        ("scales", None): (torch.rand(K // GROUP, N, generator=gen) * 0.02 + 0.001).half()})
    return layer


def _gptq_layer(gen):
    config = GPTQConfig.from_config({"bits": 4, "group_size": GROUP, "desc_act": True})
    layer = make_layer(config, K, [N], prefix="model.layers.0.mlp.up")
    g_idx = (torch.arange(K) // GROUP)[torch.randperm(K, generator=gen)].int()
    load_layer(layer, {
        ("qweight", None): pack_along_rows(torch.randint(0, 16, (K, N), generator=gen), 4),
        ("qzeros", None): pack_along_cols(torch.randint(0, 15, (K // GROUP, N), generator=gen), 4),
        ("scales", None): (torch.rand(K // GROUP, N, generator=gen) * 0.02 + 0.001).half(),
        ("g_idx", None): g_idx})
    return layer


@pytest.mark.parametrize("build", [_awq_layer, _gptq_layer], ids=["awq", "gptq-act-order"])
def test_cpu_layer_keeps_the_reference_chosen_at_load(build, monkeypatch):
    layer = build(torch.Generator().manual_seed(0))
    kernel, dense = layer.wna16_kernel, layer.wna16_dense
    assert isinstance(kernel, ReferenceKernel)
    assert kernel.spec.act_dtype == torch.float32 and kernel.spec.device.type == "cpu"
    assert set(kernel.passed_over) == {"InterleavedWordsKernel", "CanonicalWordsKernel"}
    assert all("CUDA device" in why for why in kernel.passed_over.values())

    def refuse(*args, **kwargs):
        raise AssertionError("a kernel was chosen or a weight re-packed on the forward path")
    monkeypatch.setattr(wna16_kernels, "choose_wna16_kernel", refuse)
    monkeypatch.setattr(wna16, "choose_wna16_kernel", refuse)
    monkeypatch.setattr(ReferenceKernel, "process_weights", refuse)
    x = torch.randn(3, K)
    expected = x @ dequantized_weight(layer).t()
    for _ in range(2):
        torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=1e-5)
    assert layer.wna16_kernel is kernel and layer.wna16_dense is dense


def _spec(k=4096, n=4096, group=128, bits=4, dtype=torch.bfloat16, integer_zeros=True):
    return WNA16Spec(k, n, group, bits, dtype, torch.device("cuda", 0), integer_zeros)


@pytest.fixture
def fake_gpu(monkeypatch):
    """Pretend a CUDA device of a given compute capability is present (no GPU needed:
    the choice reads only the capability)."""
    def set_capability(capability):
        monkeypatch.setattr(wna16_kernels, "cuda_capability", lambda device: capability)
        monkeypatch.setattr(wna16_kernels, "hopper_device", lambda device: capability[0] == 9)
    return set_capability


@pytest.fixture
def gluon():
    pytest.importorskip("triton.experimental.gluon", reason="the tensor-core kernels need Gluon")


def test_fake_hopper_with_bf16_picks_the_interleaved_family(fake_gpu, gluon):
    fake_gpu((9, 0))
    kernel = choose_wna16_kernel(_spec())
    assert isinstance(kernel, InterleavedWordsKernel) and kernel.hopper
    assert [kernel.route(m) for m in (1, 8, 16, 24, 64, 256, 300)] == [
        "mma", "mma", "tma_wgmma", "tma_wgmma", "tma_wgmma", "tma_wgmma", "dequant"]
    # K % 64 != 0: no TMA boxes; the cp.async wgmma kernel where it wins, then tl.dot
    narrow = choose_wna16_kernel(_spec(k=4128, group=32))
    assert [narrow.route(m) for m in (16, 24, 48, 128)] == ["mma", "wgmma", "tl_dot", "dequant"]


def test_fake_ampere_keeps_the_interleaved_words_without_hopper_kernels(fake_gpu, gluon):
    fake_gpu((8, 0))
    kernel = choose_wna16_kernel(_spec())
    assert isinstance(kernel, InterleavedWordsKernel) and not kernel.hopper
    assert [kernel.route(m) for m in (1, 24, 32, 64, 128)] == [
        "mma", "mma", "mma", "tl_dot", "dequant"]


def test_fp16_or_eight_bits_on_a_gpu_pick_the_canonical_family(fake_gpu):
    fake_gpu((9, 0))
    kernel = choose_wna16_kernel(_spec(dtype=torch.float16))
    assert isinstance(kernel, CanonicalWordsKernel)
    assert "bf16 activations" in kernel.passed_over["InterleavedWordsKernel"]
    assert [kernel.route(m) for m in (1, 2, 127, 128)] == [
        "packed_gemv", "tl_dot", "tl_dot", "dequant"]
    eight_bits = choose_wna16_kernel(_spec(bits=8))
    assert isinstance(eight_bits, CanonicalWordsKernel)
    assert [eight_bits.route(m) for m in (1, 2)] == ["gemv", "tl_dot"]


@pytest.mark.parametrize("spec,capability,reason", [
    (_spec(group=48, k=4800), (9, 0), "group size 48"),
    (_spec(bits=8), (9, 0), "8 bits"),
    (_spec(k=4100, group=4100), (9, 0), "K=4100"),
    (_spec(integer_zeros=False), (9, 0), "integer zero points in [0, 16]"),
    (_spec(), (7, 5), "compute capability 8.0"),
])
def test_an_unsupported_layout_on_a_gpu_gets_a_clear_reason(spec, capability, reason, fake_gpu,
                                                             gluon):
    fake_gpu(capability)
    ok, why = InterleavedWordsKernel.can_implement(spec)
    assert not ok and reason in why
    kernel = choose_wna16_kernel(spec)
    assert isinstance(kernel, CanonicalWordsKernel)
    assert kernel.passed_over == {"InterleavedWordsKernel": why}


def test_forcing_a_kernel_that_cannot_run_the_layer_names_why():
    layer = _awq_layer(torch.Generator().manual_seed(1))
    with pytest.raises(ValueError, match=r"model.layers.0.mlp.up: .*InterleavedWordsKernel "
                                         r"needs a CUDA device"):
        wna16.select_wna16_kernel(layer, torch.bfloat16, InterleavedWordsKernel)


def test_only_kernels_limits_the_choice_inside_its_block():
    with wna16_kernels.only_kernels(CanonicalWordsKernel):
        with pytest.raises(ValueError, match="CanonicalWordsKernel needs a CUDA device"):
            _awq_layer(torch.Generator().manual_seed(2))
    assert isinstance(_awq_layer(torch.Generator().manual_seed(2)).wna16_kernel, ReferenceKernel)


def test_activations_of_another_dtype_are_refused_until_the_kernel_is_chosen_again():
    layer = _awq_layer(torch.Generator().manual_seed(3))
    x = torch.randn(2, K).bfloat16()
    with pytest.raises(ValueError, match=r"chosen at load for torch.float32 activations on cpu"
                                         r".*select_wna16_kernel"):
        layer(x)
    wna16.select_wna16_kernel(layer, torch.bfloat16)
    assert layer.wna16_dense.dtype == torch.bfloat16
    expected = x.float() @ dequantized_weight(layer).t()
    torch.testing.assert_close(layer(x).float(), expected, rtol=2e-2, atol=2e-2)


def _gpu_layer(k, n, group, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    layer = torch.nn.Module()
    layer.prefix = f"{k}x{n}"
    codes = torch.randint(0, 16, (k, n), generator=gen).cuda()
    scales = (torch.rand(-(-k // group), n, generator=gen) * 0.02 + 0.001).half().cuda()
    zeros = torch.randint(0, 16, scales.shape, generator=gen).half().cuda()
    wna16.finalize_wna16(layer, codes, scales, zeros, group, 4, act_dtype=dtype)
    return layer


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype,family", [(torch.bfloat16, None),
                                          (torch.bfloat16, CanonicalWordsKernel),
                                          (torch.float16, None)])
@pytest.mark.parametrize("k,n,group", [(4096, 1024, 128), (4128, 520, 32)])
def test_every_route_of_the_chosen_kernel_matches_the_reference(dtype, family, k, n, group):
    layer = _gpu_layer(k, n, group, dtype, seed=k + n)
    if family is not None:
        wna16.select_wna16_kernel(layer, dtype, family)
    weight = dequantized_weight(layer).t()
    for m in (1, 3, 8, 16, 24, 40, 64, 200, 300):
        x = torch.randn(m, k, device="cuda").to(dtype)
        expected = x.float() @ weight
        got = wna16.apply_wna16(layer, x, None)
        tol = 2e-2 * expected.abs().max().item()
        torch.testing.assert_close(got.float(), expected, rtol=2e-2, atol=tol,
                                   msg=lambda text: f"route {layer.wna16_kernel.route(m)}: {text}")
