"""compressed-tensors INT8 W8A8 (``int-quantized``: symmetric per-channel int8 weights,
dynamic per-token int8 activations): the quantizer and integer matmul against the
format's formula, the Triton kernel against the reference (interpreted on CPU), the
layer loader, refused variants, and a tiny checkpoint's logits against transformers
running the same math (dequantized weights, activations fake-quantized per token), and,
in the library venv, against compressed-tensors' own loading.
"""
from __future__ import annotations

import json

import pytest
import torch

from formats import (greedy_pair, load_layer, make_layer, quantize_int8_per_channel,
                     write_quantized_checkpoint)
from libraries import in_library_venv, transformers_forward
from tamis.kernels.int8 import (int8_scaled_mm_ref, int8_scaled_mm_triton, per_token_quant_int8,
                               per_token_quant_int8_ref, per_token_quant_int8_triton)
from tamis.quant.compressed_tensors import CompressedTensorsConfig
from test_roundtrip import PROMPT, _tamis_logits, _tamis_model

torch.set_num_threads(1)  # tiny shapes: a second thread only adds sync waits
SHARDS = {"q": 32, "k": 16, "v": 16}
WEIGHTS = {"num_bits": 8, "type": "int", "strategy": "channel", "symmetric": True,
           "dynamic": False}
ACTS = {"num_bits": 8, "type": "int", "strategy": "token", "symmetric": True, "dynamic": True}


def _config(weights=None, acts=None, drop_acts=False):
    group = {"targets": ["Linear"], "weights": {**WEIGHTS, **(weights or {})}}
    if not drop_acts:
        group["input_activations"] = {**ACTS, **(acts or {})}
    return {"quant_method": "compressed-tensors", "format": "int-quantized",
            "quantization_status": "compressed", "ignore": ["lm_head"],
            "config_groups": {"group_0": group}}


def fake_quant_per_token(x: torch.Tensor, levels: float = 127.0) -> torch.Tensor:
    """Each row rounded to the int8 grid of amax(row) / levels, clamped to [-128, 127]:
    127 as vLLM and tamis, 127.5 as compressed-tensors' forward ((q_max - q_min) / 2)."""
    scale = x.abs().amax(dim=-1, keepdim=True) / levels
    return torch.round(x / scale).clamp(-128, 127) * scale


# ------------------------------------------------------------------ math

def test_per_token_quant_uses_the_row_amax():
    x = torch.randn(7, 96) * torch.rand(7, 1) * 5
    x[3] = 0.0
    codes, scale = per_token_quant_int8_ref(x)
    assert codes.dtype == torch.int8 and scale.shape == (7, 1)
    expected = x.abs().amax(dim=1, keepdim=True) / 127.0
    nonzero = torch.arange(7) != 3
    torch.testing.assert_close(scale[nonzero], expected[nonzero], rtol=0, atol=0)
    assert (codes[nonzero].float().abs().amax(dim=1) == 127).all()
    assert (codes[3] == 0).all() and torch.isfinite(scale).all()
    assert ((codes.float() * scale - x).abs() <= scale * (0.5 + 1e-5)).all()


def test_triton_quant_matches_reference_on_ties():
    """Interpreted on CPU. Row 0 has amax 127 (scale 1), so its .5 values are exact ties,
    which round half to even as torch.round does."""
    x = torch.randn(4, 300) * 3
    x[0, :8] = torch.tensor([127.0, 0.5, 1.5, 2.5, -0.5, -2.5, 126.5, -3.5])
    x[0, 8:] = x[0, 8:].clamp(-100, 100)
    x[2] = 0.0
    codes, scale = per_token_quant_int8_triton(x)
    ref_codes, ref_scale = per_token_quant_int8_ref(x)
    assert torch.equal(scale, ref_scale) and torch.equal(codes, ref_codes)
    assert codes[0, :8].tolist() == [127, 0, 2, 2, 0, -2, 126, -4]


def test_reference_matmul_is_exact_integer_dot():
    x_q = torch.randint(-128, 128, (5, 300), dtype=torch.int8)
    weight = torch.randint(-128, 128, (40, 300), dtype=torch.int8)
    x_scale, w_scale = torch.rand(5, 1) + 0.1, torch.rand(40) + 0.1
    dots = x_q.long() @ weight.long().t()
    out = int8_scaled_mm_ref(x_q, x_scale, weight, w_scale, torch.float32)
    assert torch.equal(out, dots.float() * x_scale * w_scale[None, :])


@pytest.mark.parametrize("m,n,k", [(1, 16, 64), (5, 160, 200), (33, 256, 128)])
def test_triton_kernel_matches_reference(m, n, k):
    """Interpreted on CPU: int8 tl.dot with int32 accumulation, scales in the epilogue."""
    x_q, x_scale = per_token_quant_int8(torch.randn(m, k))
    weight, w_scale = quantize_int8_per_channel(torch.randn(n, k) * 0.1)
    expected = int8_scaled_mm_ref(x_q, x_scale, weight, w_scale, torch.float32)
    out = int8_scaled_mm_triton(x_q, x_scale, weight, w_scale, torch.float32)
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("m", [1, 64, 256])
def test_triton_kernel_on_gpu_at_llama_shapes(m):
    from tamis.kernels.int8 import int8_linear
    n, k = 4096, 4096
    weight, w_scale = quantize_int8_per_channel(torch.randn(n, k) * 0.02)
    weight, w_scale = weight.cuda(), w_scale.cuda()
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    x_q, x_scale = per_token_quant_int8_ref(x)
    codes, scales = per_token_quant_int8(x)                    # the Triton quantizer
    # Compiled, Triton divides fp32 within 2 ulp of torch's exact division: a value on a
    # rounding boundary may round to the neighbouring integer.
    torch.testing.assert_close(scales, x_scale, rtol=3e-7, atol=0)
    step = (codes.int() - x_q.int()).abs()
    assert int(step.max()) <= 1 and float((step > 0).float().mean()) < 1e-3
    expected = int8_scaled_mm_ref(x_q, x_scale, weight, w_scale, torch.float32)
    torch.testing.assert_close(int8_linear(x, weight, w_scale).float(), expected,
                               rtol=1.6e-2, atol=1e-2)


# ------------------------------------------------------------------ layer and config

def test_fused_layer_runs_w8a8():
    layer = make_layer(CompressedTensorsConfig.from_config(_config()), 64, list(SHARDS.values()))
    assert type(layer.quant_method).__name__ == "Int8W8A8LinearMethod"
    tensors, dense = {}, []
    for shard, n in SHARDS.items():
        weight, scale = quantize_int8_per_channel(torch.randn(n, 64) * 0.1)
        tensors.update({("weight", shard): weight, ("weight_scale", shard): scale})
        dense.append(weight.float() * scale)
    load_layer(layer, tensors)
    x = torch.randn(5, 64)
    expected = fake_quant_per_token(x) @ torch.cat(dense).t()
    torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("config,message", [
    (_config(weights={"symmetric": False}), r"asymmetric int8 weights"),
    (_config(weights={"strategy": "group", "group_size": 128}),
     r"int weights num_bits=8 strategy='group'"),
    (_config(acts={"dynamic": False}), r"static int8 input activation scales"),
    (_config(acts={"symmetric": False}), r"asymmetric int8 input activations"),
    (_config(acts={"strategy": "tensor"}), r"input activation strategy 'tensor'"),
    (_config(drop_acts=True), r"int8 weights without quantized input activations"),
])
def test_unsupported_variants_are_refused_by_name(config, message):
    with pytest.raises(ValueError, match=r"config group 'group_0' has " + message):
        CompressedTensorsConfig.from_config(config)


# ------------------------------------------------------------------ a tiny checkpoint

@pytest.fixture(scope="module")
def int8_model(tiny_checkpoint, tmp_path_factory):
    def quantize(weight):
        codes, scale = quantize_int8_per_channel(weight)
        return {"weight": codes, "weight_scale": scale}
    return write_quantized_checkpoint(tiny_checkpoint("llama"), tmp_path_factory.mktemp("int8"),
                                      quantize, _config())


def _fake_quant_reference(model_dir, levels: float = 127.0):
    """transformers' Llama with the dequantized weights, each decoder linear's input
    fake-quantized per token (``fake_quant_per_token``): the W8A8 math in fp32."""
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_dir)
    del config.quantization_config
    reference = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    tensors = load_file(str(model_dir / "model.safetensors"))
    state = {name: t.float() for name, t in tensors.items() if not name.endswith("weight_scale")}
    for name in list(state):
        if f"{name}_scale" in tensors:
            state[name] = state[name] * tensors[f"{name}_scale"].float()
    reference.load_state_dict(state, strict=True)
    for name, module in reference.model.layers.named_modules():
        if isinstance(module, torch.nn.Linear):
            module.register_forward_pre_hook(
                lambda _, args: (fake_quant_per_token(args[0], levels),))
    return reference


def test_tiny_checkpoint_matches_the_w8a8_math(int8_model):
    model = _tamis_model(int8_model)
    assert type(model.model.layers[0].self_attn.qkv_proj.quant_method).__name__ == \
        "Int8W8A8LinearMethod"
    with torch.no_grad():
        expected = _fake_quant_reference(int8_model)(torch.tensor([PROMPT])).logits[0]
    logits = _tamis_logits(model, PROMPT)
    torch.testing.assert_close(logits, expected, atol=2e-4, rtol=0)
    assert torch.equal(logits.argmax(-1), expected.argmax(-1))


def test_tiny_checkpoint_greedy_tokens_match_the_w8a8_math(int8_model):
    prompts = [PROMPT, PROMPT[:7], list(range(1000, 1021))]
    ours, theirs = greedy_pair(int8_model, _fake_quant_reference(int8_model), prompts)
    assert ours == theirs


_LLMCOMPRESSOR_W8A8 = """
import sys, torch
from llmcompressor import oneshot
from llmcompressor.modifiers.quantization import QuantizationModifier
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32)
oneshot(model=model, recipe=QuantizationModifier(targets="Linear", scheme="W8A8",
                                                 ignore=["lm_head"]))
model.save_pretrained(sys.argv[2], save_compressed=True)
"""


def _run_compressed_tensors(model_dir, out):
    """transformers + compressed-tensors on ``model_dir``: logits of PROMPT and the
    decompressed weight of every decoder linear."""
    return transformers_forward(model_dir, PROMPT, out)


def _check_against_compressed_tensors(model_dir, out):
    """compressed-tensors decompresses to exactly tamis's weights, and its forward is the
    fake-quant reference on its amax / 127.5 grid, bit for bit; tamis runs the same math
    on vLLM's amax / 127 grid (kernels/int8.py says why), equal to the reference on that
    grid, so against compressed-tensors the logits are only close."""
    from test_roundtrip import _tamis_weight

    library = _run_compressed_tensors(model_dir, out)
    model = _tamis_model(model_dir)
    assert type(model.model.layers[0].self_attn.qkv_proj.quant_method).__name__ == \
        "Int8W8A8LinearMethod"
    assert len(library["weights"]) == 14
    for name, weight in library["weights"].items():
        assert torch.equal(_tamis_weight(model, name), weight), name
    prompt = torch.tensor([PROMPT])
    with torch.no_grad():
        on_its_grid = _fake_quant_reference(model_dir, 127.5)(prompt).logits[0]
        on_ours = _fake_quant_reference(model_dir)(prompt).logits[0]
    torch.testing.assert_close(library["logits"], on_its_grid, atol=1e-5, rtol=0)
    logits = _tamis_logits(model, PROMPT)
    torch.testing.assert_close(logits, on_ours, atol=2e-4, rtol=0)
    torch.testing.assert_close(logits, library["logits"], atol=0.3, rtol=0)


@pytest.mark.network   # the library venv is built from PyPI on first use
def test_tiny_checkpoint_matches_compressed_tensors(int8_model, tmp_path):
    _check_against_compressed_tensors(int8_model, tmp_path / "run.pt")


@pytest.mark.network
def test_llm_compressor_w8a8_checkpoint_loads(tiny_checkpoint, tmp_path):
    """llm-compressor's W8A8 preset (RTN) writes the checkpoint: tamis reads it as
    compressed-tensors does."""
    written = tmp_path / "llmc-w8a8"
    in_library_venv(_LLMCOMPRESSOR_W8A8, str(tiny_checkpoint("llama")), str(written))
    config = json.loads((written / "config.json").read_text())["quantization_config"]
    assert config["format"] == "int-quantized"
    _check_against_compressed_tensors(written, tmp_path / "run.pt")
