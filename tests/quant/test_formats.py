"""Each checkpoint format, built by hand from its published description, loads through
tamis's fused linear layers and dequantizes to exactly the published formula."""
from __future__ import annotations

import json

import pytest
import torch

from formats import load_layer, make_layer, pack_along_cols, pack_along_rows, pack_awq
from tamis.kernels.fp8 import FP8_DTYPE
from tamis.quant import get_quant_config
from tamis.quant.awq import AWQConfig
from tamis.quant.compressed_tensors import CompressedTensorsConfig
from tamis.quant.fp8 import Fp8Config
from tamis.quant.gptq import GPTQConfig
from tamis.quant.wna16_kernels import dequantized_weight

torch.set_num_threads(1)  # tiny shapes: a second thread only adds sync waits
SHARDS = {"q": 32, "k": 16, "v": 16}


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _check_forward(layer, expected_weight):
    x = torch.randn(5, expected_weight.shape[1], generator=_gen(9))
    torch.testing.assert_close(layer(x), x @ expected_weight.t(), rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------ AWQ

@pytest.mark.parametrize("group_size", [32, 64])
def test_awq_gemm_layout(group_size):
    k = 128
    layer = make_layer(AWQConfig.from_config({"bits": 4, "group_size": group_size,
                                              "zero_point": True, "version": "GEMM"}),
                       k, list(SHARDS.values()))
    tensors, expected = {}, []
    for i, (shard, n) in enumerate(SHARDS.items()):
        gen = _gen(i)
        codes = torch.randint(0, 16, (k, n), generator=gen)
        zeros = torch.randint(0, 16, (k // group_size, n), generator=gen)
        scales = (torch.rand(k // group_size, n, generator=gen) * 0.01 + 1e-3).half()
        tensors.update({("qweight", shard): pack_awq(codes), ("qzeros", shard): pack_awq(zeros),
                        ("scales", shard): scales})
        rows = torch.arange(k) // group_size
        expected.append(((codes - zeros[rows]).float() * scales.float()[rows]).t())
    load_layer(layer, tensors)
    expected = torch.cat(expected)
    assert torch.equal(dequantized_weight(layer), expected)
    _check_forward(layer, expected)


def test_awq_rejects_k_not_multiple_of_group():
    config = AWQConfig.from_config({"bits": 4, "group_size": 128, "version": "gemm"})
    with pytest.raises(ValueError, match=r"mlp.down_proj.*K=576.*group 128"):
        make_layer(config, 576, [64], prefix="model.layers.3.mlp.down_proj")


# ------------------------------------------------------------------ GPTQ

def _gptq_shard(k, n, bits, group_size, act_order, fmt, sym, seed):
    gen = _gen(seed)
    maxq = 2**bits - 1
    group = k if group_size == -1 else group_size
    groups = -(-k // group)
    codes = torch.randint(0, maxq + 1, (k, n), generator=gen)
    if sym:
        zeros = torch.full((groups, n), (maxq + 1) // 2)
    else:
        zeros = torch.randint(1, maxq + 1, (groups, n), generator=gen)
    scales = (torch.rand(groups, n, generator=gen) * 0.01 + 1e-3).half()
    if act_order:
        order = torch.randperm(k, generator=_gen(100))  # same for every shard of a layer
        g_idx = torch.empty(k, dtype=torch.int32)
        g_idx[order] = (torch.arange(k) // group).to(torch.int32)
    else:
        g_idx = (torch.arange(k) // group).to(torch.int32)
    stored = zeros - 1 if fmt == "gptq" else zeros
    tensors = {"qweight": pack_along_rows(codes, bits), "qzeros": pack_along_cols(stored, bits),
               "scales": scales, "g_idx": g_idx}
    g = g_idx.long()
    weight = ((codes - zeros[g]).float() * scales.float()[g]).t()
    return tensors, weight


@pytest.mark.parametrize("bits,group_size,act_order,fmt,sym,k", [
    (4, 32, False, "gptq", True, 64),
    (4, 64, True, "gptq", True, 128),
    (4, -1, False, "gptq_v2", False, 64),
    (8, 32, True, "gptq_v2", True, 64),
    (8, 128, False, "gptq", False, 128),
    (4, 64, True, "gptq", False, 96),      # K=96, group 64: ceil(K/G) = 2 groups
])
def test_gptq_layout(bits, group_size, act_order, fmt, sym, k):
    config = GPTQConfig.from_config({"bits": bits, "group_size": group_size, "desc_act": act_order,
                                     "sym": sym, "checkpoint_format": fmt})
    layer = make_layer(config, k, list(SHARDS.values()))
    tensors, expected = {}, []
    for i, (shard, n) in enumerate(SHARDS.items()):
        shard_tensors, weight = _gptq_shard(k, n, bits, group_size, act_order, fmt, sym, seed=i)
        tensors.update({(name, shard): t for name, t in shard_tensors.items()})
        expected.append(weight)
    load_layer(layer, tensors)
    expected = torch.cat(expected)
    assert torch.equal(dequantized_weight(layer), expected)
    assert hasattr(layer, "wna16_perm") == act_order
    _check_forward(layer, expected)


def test_gptq_k576_group128_has_five_groups():
    """SmolLM2's hidden size: 576 = 4.5 groups of 128, so GPTQ stores ceil = 5."""
    config = GPTQConfig.from_config({"bits": 4, "group_size": 128, "desc_act": True})
    layer = make_layer(config, 576, [16], prefix="model.layers.0.mlp.gate_proj")
    tensors, expected = _gptq_shard(576, 16, 4, 128, True, "gptq", True, seed=3)
    assert tensors["scales"].shape == (5, 16)
    load_layer(layer, {(name, None): t for name, t in tensors.items()})
    assert torch.equal(dequantized_weight(layer), expected)


def test_gptq_v1_zero_convention_matters():
    """Reading a v2 checkpoint as v1 shifts every zero point: the weights differ."""
    tensors, expected = _gptq_shard(64, 16, 4, 32, False, "gptq_v2", False, seed=5)
    loaded = {}
    for fmt in ("gptq", "gptq_v2"):
        config = GPTQConfig.from_config({"bits": 4, "group_size": 32, "sym": False,
                                         "checkpoint_format": fmt})
        layer = make_layer(config, 64, [16])
        load_layer(layer, {(name, None): t for name, t in tensors.items()})
        loaded[fmt] = dequantized_weight(layer)
    assert torch.equal(loaded["gptq_v2"], expected)
    assert not torch.allclose(loaded["gptq"], expected)


# ------------------------------------------------------------------ compressed-tensors W4A16

def _ct_config(bits, strategy, group_size, sym):
    weights = {"num_bits": bits, "type": "int", "symmetric": sym, "strategy": strategy,
               "group_size": group_size if strategy == "group" else None}
    return {"quant_method": "compressed-tensors", "format": "pack-quantized",
            "quantization_status": "compressed", "ignore": ["lm_head"],
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights,
                                          "input_activations": None}}}


@pytest.mark.parametrize("bits,strategy,group_size,sym,k", [
    (4, "group", 32, True, 64), (4, "group", 32, False, 64), (4, "channel", None, True, 64),
    (8, "group", 64, False, 128), (4, "group", 64, True, 96),
])
def test_compressed_tensors_pack_quantized(bits, strategy, group_size, sym, k):
    config = CompressedTensorsConfig.from_config(_ct_config(bits, strategy, group_size, sym))
    layer = make_layer(config, k, list(SHARDS.values()))
    offset = 1 << (bits - 1)
    group = group_size or k
    groups = -(-k // group)
    tensors, expected = {}, []
    for i, (shard, n) in enumerate(SHARDS.items()):
        gen = _gen(i)
        q = torch.randint(-offset, offset, (n, k), generator=gen)       # signed codes
        zp = torch.randint(-offset, offset, (n, groups), generator=gen) if not sym else None
        scale = torch.rand(n, groups, generator=gen) * 0.01 + 1e-3
        tensors[("weight_packed", shard)] = pack_along_rows((q + offset).t().contiguous(), bits).t().contiguous()
        tensors[("weight_scale", shard)] = scale
        tensors[("weight_shape", shard)] = torch.tensor([n, k])
        if not sym:
            tensors[("weight_zero_point", shard)] = pack_along_rows(zp + offset, bits)
        cols = torch.arange(k) // group
        zero = zp[:, cols] if zp is not None else 0
        expected.append((q - zero).float() * scale[:, cols])
    load_layer(layer, tensors)
    expected = torch.cat(expected)
    assert torch.equal(dequantized_weight(layer), expected)
    _check_forward(layer, expected)


def test_compressed_tensors_weight_shape_mismatch_names_layer():
    config = CompressedTensorsConfig.from_config(_ct_config(4, "group", 32, True))
    layer = make_layer(config, 64, [16], prefix="model.layers.2.mlp.up_proj")
    tensors = {("weight_packed", None): torch.zeros(16, 8, dtype=torch.int32),
               ("weight_scale", None): torch.ones(16, 2),
               ("weight_shape", None): torch.tensor([16, 60])}
    with pytest.raises(ValueError, match=r"model.layers.2.mlp.up_proj: weight_shape"):
        load_layer(layer, tensors)


# ------------------------------------------------------------------ FP8

def _fp8(n, k, seed):
    w = torch.randn(n, k, generator=_gen(seed)) * 0.05
    return (w / (w.abs().max() / 448)).to(FP8_DTYPE)


@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("scheme", ["dynamic", "static"])
def test_fp8_checkpoint_fused_scales(per_channel, scheme):
    k = 64
    layer = make_layer(Fp8Config.from_config({"quant_method": "fp8", "activation_scheme": scheme}),
                       k, list(SHARDS.values()))
    tensors, expected, input_scales = {}, [], []
    for i, (shard, n) in enumerate(SHARDS.items()):
        weight = _fp8(n, k, i)
        scale = (torch.rand(n, 1) + 0.5) * 1e-3 if per_channel else torch.tensor(1e-3 * (i + 1))
        tensors[("weight", shard)] = weight
        tensors[("weight_scale", shard)] = scale
        if scheme == "static":
            input_scales.append(0.01 * (i + 1))
            tensors[("input_scale", shard)] = torch.tensor(input_scales[-1])
        expected.append(weight.float() * scale.reshape(-1, 1))
    load_layer(layer, tensors)
    expected = torch.cat(expected)
    assert torch.equal(layer.weight.float() * layer.weight_scale[:, None], expected)
    if scheme == "static":
        assert layer.input_scale.item() == pytest.approx(max(input_scales))
    _check_forward(layer, expected)  # CPU: W8A16 through the dequantized weight


def test_online_fp8_quantizes_per_channel():
    config = get_quant_config("/nonexistent", {}, "fp8")
    layer = make_layer(config, 64, [48], prefix="model.layers.0.mlp.down_proj")
    weight = torch.randn(48, 64, generator=_gen(1)) * 0.02
    load_layer(layer, {("weight", None): weight})
    assert layer.weight.dtype == FP8_DTYPE and layer.weight_scale.shape == (48,)
    scale = weight.abs().amax(dim=1) / 448
    assert torch.equal(layer.weight_scale, scale)
    assert torch.equal(layer.weight, (weight / scale[:, None]).to(FP8_DTYPE))
    dequant = layer.weight.float() * scale[:, None]
    assert ((dequant - weight).abs() <= weight.abs() * 2**-4 + 1e-9).all()


def test_fp8_ignored_layers_stay_unquantized():
    config = Fp8Config.from_config({"activation_scheme": "dynamic", "ignored_layers": [
        "model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.k_proj",
        "model.layers.0.self_attn.v_proj"], "modules_to_not_convert": ["mlp.down_proj"]})
    config.packed_modules_mapping = {"qkv_proj": ["q_proj", "k_proj", "v_proj"]}
    assert type(config.get_linear_method("model.layers.0.self_attn.qkv_proj")).__name__ == \
        "UnquantizedLinearMethod"
    assert type(config.get_linear_method("model.layers.5.mlp.down_proj")).__name__ == \
        "UnquantizedLinearMethod"
    assert type(config.get_linear_method("model.layers.1.self_attn.qkv_proj")).__name__ == \
        "Fp8LinearMethod"
    partial = Fp8Config.from_config({"ignored_layers": ["model.layers.0.self_attn.q_proj"]})
    with pytest.raises(ValueError, match="only some of the fused shards"):
        partial.get_linear_method("model.layers.0.self_attn.qkv_proj")


def test_fp8_bad_scale_shape_names_layer():
    layer = make_layer(Fp8Config.from_config({}), 64, [16], prefix="model.layers.1.mlp.up_proj")
    with pytest.raises(ValueError, match=r"model.layers.1.mlp.up_proj: weight_scale has shape"):
        load_layer(layer, {("weight", None): _fp8(16, 64, 0),
                           ("weight_scale", None): torch.ones(3)})


# ------------------------------------------------------------------ detection

def test_detection_sources_and_errors(tmp_path):
    assert get_quant_config(tmp_path, {}, None) is None
    awq = {"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm"}
    assert get_quant_config(tmp_path, {"quantization_config": awq}, None).get_name() == "awq"
    assert get_quant_config(tmp_path, {"quantization_config": awq}, "awq").get_name() == "awq"
    with pytest.raises(ValueError, match=r"requested but the checkpoint is quantized with 'awq'"):
        get_quant_config(tmp_path, {"quantization_config": awq}, "gptq")
    with pytest.raises(ValueError, match=r"quantized with 'bitsandbytes'; tamis supports awq"):
        get_quant_config(tmp_path, {"quantization_config": {"quant_method": "bitsandbytes"}}, None)
    with pytest.raises(ValueError, match=r"unknown quantization 'int3'"):
        get_quant_config(tmp_path, {}, "int3")
    with pytest.raises(ValueError, match=r"'gptq' needs a checkpoint quantized with gptq"):
        get_quant_config(tmp_path, {}, "gptq")
    with pytest.raises(ValueError, match=r"bits=3; tamis supports \(4, 8\)"):
        get_quant_config(tmp_path, {"quantization_config": {"quant_method": "gptq", "bits": 3}}, None)
    with pytest.raises(ValueError, match=r"group_size=16; tamis supports"):
        get_quant_config(tmp_path, {"quantization_config": {**awq, "group_size": 16}}, None)
    with pytest.raises(ValueError, match=r"weight_block_size=\[64, 64\]; tamis supports"):
        get_quant_config(tmp_path, {"quantization_config": {
            "quant_method": "fp8", "weight_block_size": [64, 64]}}, None)
    # Legacy side files.
    (tmp_path / "quantize_config.json").write_text(json.dumps({"bits": 8, "group_size": 64,
                                                               "desc_act": True}))
    legacy = get_quant_config(tmp_path, {}, None)
    assert (legacy.get_name(), legacy.bits, legacy.desc_act) == ("gptq", 8, True)
    (tmp_path / "quantize_config.json").unlink()
    (tmp_path / "quant_config.json").write_text(json.dumps({"zero_point": True, "q_group_size": 64,
                                                            "w_bit": 4, "version": "GEMM"}))
    legacy = get_quant_config(tmp_path, {}, "awq")
    assert (legacy.get_name(), legacy.group_size) == ("awq", 64)
    ct = get_quant_config(tmp_path, {"quantization_config": _ct_config(4, "group", 32, True)},
                          "compressed_tensors")
    assert ct.get_name() == "compressed-tensors"


@pytest.mark.parametrize("strategy,static", [("channel", False), ("tensor", True)])
def test_compressed_tensors_fp8(strategy, static):
    acts = {"num_bits": 8, "type": "float", "strategy": "tensor" if static else "token",
            "dynamic": not static, "symmetric": True}
    config = CompressedTensorsConfig.from_config({
        "quant_method": "compressed-tensors", "format": "float-quantized",
        "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": acts,
                                      "weights": {"num_bits": 8, "type": "float",
                                                  "strategy": strategy, "symmetric": True}}}})
    layer = make_layer(config, 64, list(SHARDS.values()))
    tensors, expected = {}, []
    for i, (shard, n) in enumerate(SHARDS.items()):
        weight = _fp8(n, 64, i)
        scale = (torch.rand(n, 1) + 0.5) * 1e-3 if strategy == "channel" else torch.tensor([2e-3 * (i + 1)])
        tensors.update({("weight", shard): weight, ("weight_scale", shard): scale})
        if static:
            tensors[("input_scale", shard)] = torch.tensor([0.01 * (i + 1)])
        expected.append(weight.float() * scale.reshape(-1, 1))
    load_layer(layer, tensors)
    expected = torch.cat(expected)
    assert type(layer.quant_method).__name__ == "Fp8LinearMethod"
    assert torch.equal(layer.weight.float() * layer.weight_scale[:, None], expected)
    if static:
        assert layer.input_scale.item() == pytest.approx(0.03)
    _check_forward(layer, expected)
