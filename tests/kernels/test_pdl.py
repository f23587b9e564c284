"""Programmatic dependent launch (``tamis.kernels.pdl``): the mode switch, and on a
Hopper GPU chains of GEMMs each reading the output of the one before, launched with
PDL in every trigger mode, eager and from a CUDA graph, against the same chain
launched without it. PDL changes when a kernel starts, not its arithmetic: any
difference is a kernel that read its input, or wrote its output, too early."""
from __future__ import annotations

import pytest
import torch

from tamis.kernels import pdl


@pytest.fixture
def restore_mode():
    before = pdl.mode()
    yield
    pdl.set_mode(before)


def test_mode_switch_validates_and_cpu_never_launches_with_pdl(restore_mode):
    with pytest.raises(ValueError, match="PDL mode must be one of"):
        pdl.set_mode("sometimes")
    for mode in pdl.MODES:
        pdl.set_mode(mode)
        assert pdl.mode() == mode
        assert not pdl.launch(torch.device("cpu"))
        assert pdl.trigger(torch.device("cpu")) == 0


def _hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9


needs_hopper = pytest.mark.skipif(not _hopper(), reason="PDL needs a Hopper GPU")


def _w4_layer(k: int, seed: int):
    """A bf16 W4A16 layer on the GPU, with the kernel chosen at load (interleaved words)."""
    from tamis.quant.wna16 import finalize_wna16
    gen = torch.Generator(device="cuda").manual_seed(seed)
    codes = torch.randint(0, 16, (k, k), device="cuda", generator=gen)
    scales = (torch.rand(k // 128, k, device="cuda", generator=gen) * 0.004 + 0.004).half()
    zeros = torch.randint(0, 16, (k // 128, k), device="cuda", generator=gen).half()
    layer = torch.nn.Module()
    layer.prefix = f"layer{seed}"
    finalize_wna16(layer, codes, scales, zeros, 128, 4, act_dtype=torch.bfloat16)
    assert layer.wna16_interleaved
    return layer


def _chain(x, layers, step):
    """x through every layer in turn, with a torch kernel (not launched with PDL)
    between every second pair: a PDL launch after a plain one too."""
    for i, layer in enumerate(layers):
        x = step(x, layer)
        if i % 2:
            x = x * 1.0
    return x


def _run(mode, x, layers, step, graph: bool):
    pdl.set_mode(mode)
    if not graph:
        return _chain(x, layers, step)
    static_x = x.clone()
    _chain(static_x, layers, step)  # compile outside the capture
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = _chain(static_x, layers, step)
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    return out.clone()


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("graph", [False, True])
@pytest.mark.parametrize("m", [1, 8, 16, 32, 64])
def test_w4a16_chain_with_pdl_equals_chain_without(m, graph, restore_mode):
    from tamis.quant.wna16 import apply_wna16
    k = 4096
    layers = [_w4_layer(k, seed) for seed in range(6)]
    x = torch.randn(m, k, device="cuda").bfloat16()

    def step(h, layer):
        return apply_wna16(layer, h, None)

    expected = _run("off", x, layers, step, graph=False)
    assert expected.abs().max() > 0 and torch.isfinite(expected).all()
    for mode in ("exit", "late", "early", "auto"):
        got = _run(mode, x, layers, step, graph)
        assert torch.equal(got, expected), f"mode {mode}: {(got - expected).abs().max()}"


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("graph", [False, True])
def test_dense_gemv_chain_with_pdl_equals_chain_without(graph, restore_mode):
    from tamis.kernels.gemv import linear
    k = 4096
    gen = torch.Generator(device="cuda").manual_seed(0)
    layers = [(torch.randn(k, k, device="cuda", generator=gen) / k ** 0.5).bfloat16()
              for _ in range(6)]
    x = torch.randn(1, k, device="cuda").bfloat16()
    expected = _run("off", x, layers, linear, graph=False)
    for mode in ("exit", "late", "early", "auto"):
        got = _run(mode, x, layers, linear, graph)
        assert torch.equal(got, expected), f"mode {mode}: {(got - expected).abs().max()}"
