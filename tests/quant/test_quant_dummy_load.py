"""load_format="dummy" with quantized checkpoints' configs: every method loads at a tiny
Llama shape (no checkpoint file) and runs a forward pass, so speed benchmarks can build
quantized 8B-shape models without weights."""
from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch

from tamis.engine.attention.metadata import forward_context
from tamis.engine.loader import load_model

TINY_LLAMA = dict(
    architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=512, hidden_size=256,
    intermediate_size=512, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    head_dim=64, hidden_act="silu", max_position_embeddings=1024, rms_norm_eps=1e-5,
    rope_theta=10000.0, tie_word_embeddings=False, torch_dtype="float32")

INT4 = {"type": "int", "num_bits": 4, "strategy": "group", "group_size": 128, "symmetric": True}
QUANT_CONFIGS = {
    "awq": {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True,
            "version": "gemm"},
    "gptq-act-order": {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": True},
    "fp8-dynamic": {"quant_method": "fp8", "activation_scheme": "dynamic"},
    "fp8-static": {"quant_method": "fp8", "activation_scheme": "static"},
    "ct-w4a16-act-order": {
        "quant_method": "compressed-tensors", "format": "pack-quantized",
        "config_groups": {"g": {"targets": ["Linear"], "weights": {**INT4, "actorder": "group"}}},
        "ignore": ["lm_head"]},
    "ct-fp8": {
        "quant_method": "compressed-tensors", "format": "float-quantized",
        "config_groups": {"g": {"targets": ["Linear"],
                                "weights": {"type": "float", "num_bits": 8, "strategy": "channel"},
                                "input_activations": {"type": "float", "num_bits": 8,
                                                      "strategy": "token", "dynamic": True}}},
        "ignore": ["lm_head"]},
}


def _load(tmp_path, name, dtype="float32"):
    config = dict(TINY_LLAMA, quantization_config=QUANT_CONFIGS[name])
    (tmp_path / "config.json").write_text(json.dumps(config))
    engine_config = SimpleNamespace(model=str(tmp_path), dtype=dtype, load_format="dummy",
                                    quantization=None, seed=0, attention_backend="torch")
    model, _ = load_model(engine_config, "cpu")
    return model


@pytest.mark.parametrize("name", sorted(QUANT_CONFIGS))
def test_dummy_quantized_model_loads_and_runs(tmp_path, name):
    torch.set_num_threads(1)
    model = _load(tmp_path, name)
    with forward_context(None, []):
        hidden = model(torch.arange(6), torch.arange(6))
    assert hidden.shape == (6, TINY_LLAMA["hidden_size"]) and torch.isfinite(hidden).all()


def test_dummy_act_order_is_a_real_permutation(tmp_path):
    """GPTQ act-order dummies shuffle the group index, so the x[..., perm] path runs."""
    layer = _load(tmp_path, "gptq-act-order").model.layers[0].mlp.down_proj
    perm = layer.wna16_perm
    assert perm is not None and not torch.equal(perm, torch.arange(perm.numel()))


def test_dummy_fp8_weights_have_the_dummy_spread(tmp_path):
    layer = _load(tmp_path, "fp8-dynamic").model.layers[0].mlp.gate_up_proj
    assert layer.weight.dtype == torch.float8_e4m3fn
    dense = layer.weight.float() * layer.weight_scale[:, None]
    assert math.isclose(dense.std().item(), 0.02, rel_tol=0.1)


@pytest.mark.parametrize("name", ["awq", "gptq-act-order"])
def test_w4a16_kernels_are_chosen_at_load_for_the_model_dtype(tmp_path, name, monkeypatch):
    """Every W4A16 layer of a CPU model gets the reference kernel at load, for the
    model's dtype, and a forward pass chooses nothing again."""
    from tamis.quant import wna16, wna16_kernels
    model = _load(tmp_path, name, dtype="bfloat16")
    layers = [m for m in model.modules() if hasattr(m, "wna16_kernel")]
    assert len(layers) == 4 * TINY_LLAMA["num_hidden_layers"]  # qkv, o, gate_up, down
    for layer in layers:
        assert isinstance(layer.wna16_kernel, wna16_kernels.ReferenceKernel)
        assert layer.wna16_kernel.spec.act_dtype == torch.bfloat16
        assert layer.wna16_dense.dtype == torch.bfloat16
    chosen = [layer.wna16_kernel for layer in layers]

    def refuse(*args, **kwargs):
        raise AssertionError("a W4A16 kernel was chosen on the forward path")
    monkeypatch.setattr(wna16, "choose_wna16_kernel", refuse)
    with forward_context(None, []):
        hidden = model(torch.arange(6), torch.arange(6))
    assert hidden.dtype == torch.bfloat16 and torch.isfinite(hidden).all()
    assert [layer.wna16_kernel for layer in layers] == chosen
