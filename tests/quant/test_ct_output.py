"""`tamis quantize` writes compressed-tensors checkpoints that others read: FP8 as
``float-quantized`` (per-channel weight scales, dynamic per-token FP8 activations) and,
with ``--format compressed-tensors``, W4A16 / W8A16 as ``pack-quantized``.

Here: the written config and tensors follow the format, tamis reloads them with the
quantizer's weights, and, in the library venv (tests/quant/libraries.py), transformers
with compressed-tensors decompresses every linear to tamis's weights bit for bit and
computes tamis's logits: exactly for int weights (both run the dequantized weight in
fp32); for FP8, which transformers runs as W8A8 (activations fake-quantized per token),
equal to tamis's W8A8 math (the GPU path's reference, ``fp8_linear_ref``).
"""
from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from libraries import transformers_forward
from tamis.kernels import fp8 as fp8_kernels
from tamis.quant.quantizer.pipeline import QuantizeOptions, quantize_checkpoint
from test_roundtrip import (PROMPT, SHAPES, _round_trip, _tamis_logits, _tamis_model,
                            _tamis_weight, samples, tiny)  # noqa: F401  (fixtures)

torch.set_num_threads(1)  # tiny shapes: a second thread only adds sync waits
W4_CASES = {  # name -> QuantizeOptions arguments (all --format compressed-tensors)
    "gptq-g64-act-order": dict(method="gptq", group_size=64, desc_act=True,
                               static_groups=True),
    "gptq-asym-g32": dict(method="gptq", group_size=32, sym=False),
    "gptq-8bit-channel": dict(method="gptq", bits=8, group_size=-1, rotate=False),
    "awq-g64": dict(method="awq", group_size=64),
}


def _config(out) -> dict:
    return json.loads((out / "config.json").read_text())["quantization_config"]


def _tensors(out) -> dict[str, torch.Tensor]:
    with safe_open(str(out / "model.safetensors"), framework="pt") as handle:
        return {name: handle.get_tensor(name) for name in handle.keys()}


@pytest.fixture(scope="module")
def fp8_checkpoint(tiny, samples, tmp_path_factory):  # noqa: F811
    out = tmp_path_factory.mktemp("ct") / "fp8"
    result = quantize_checkpoint(tiny, out, QuantizeOptions("fp8"), False, samples)
    return out, result


def test_fp8_writes_float_quantized(fp8_checkpoint):
    out, result = fp8_checkpoint
    config = _config(out)
    (group,) = config["config_groups"].values()
    assert (config["quant_method"], config["format"], group["format"]) == (
        "compressed-tensors", "float-quantized", "float-quantized")
    assert group["weights"]["strategy"] == "channel" and group["weights"]["type"] == "float"
    acts = group["input_activations"]
    assert (acts["strategy"], acts["dynamic"], acts["type"]) == ("token", True, "float")
    assert config["ignore"] == ["lm_head"]
    tensors = _tensors(out)
    name = "model.layers.1.mlp.down_proj"
    assert tensors[f"{name}.weight"].dtype == torch.float8_e4m3fn
    assert tensors[f"{name}.weight_scale"].shape == (SHAPES["hidden_size"], 1)
    assert torch.equal(tensors[f"{name}.weight"].float() * tensors[f"{name}.weight_scale"],
                       result.weights[name].dequantize())
    # Per-channel: the rows' scales differ (one per-tensor scale would repeat).
    assert tensors[f"{name}.weight_scale"].unique().numel() > 1


def test_fp8_reloads_in_tamis(fp8_checkpoint):
    out, result = fp8_checkpoint
    model = _tamis_model(out)
    assert type(model.model.layers[0].mlp.down_proj.quant_method).__name__ == "Fp8LinearMethod"
    for name, quantized in result.weights.items():
        assert torch.equal(_tamis_weight(model, name), quantized.dequantize()), name


@pytest.mark.parametrize("case", sorted(W4_CASES))
def test_pack_quantized_round_trip(tiny, samples, tmp_path, case):  # noqa: F811
    options = QuantizeOptions(format="compressed-tensors", **W4_CASES[case])
    result = _round_trip(tiny, tmp_path, options, samples)
    config = _config(tmp_path / "out")
    (group,) = config["config_groups"].values()
    weights = group["weights"]
    assert (config["quant_method"], config["format"]) == ("compressed-tensors", "pack-quantized")
    assert (weights["num_bits"], weights["symmetric"]) == (options.bits, options.sym)
    assert weights["strategy"] == ("channel" if options.group_size == -1 else "group")
    tensors = _tensors(tmp_path / "out")
    name = "model.layers.0.mlp.down_proj"
    assert weights["actorder"] == ("weight" if options.static_groups else None)
    assert f"{name}.weight_g_idx" not in tensors
    assert (f"{name}.weight_zero_point" in tensors) == (not options.sym)


def test_dynamic_act_order_groups_are_refused_in_compressed_tensors():
    """compressed-tensors 0.19 refuses actorder "group" (it reads only "weight"), so
    tamis does not write a checkpoint that library would reject."""
    with pytest.raises(ValueError, match="--desc-act with --format compressed-tensors needs "
                                         "--static-groups"):
        QuantizeOptions("gptq", desc_act=True, format="compressed-tensors")
    assert QuantizeOptions("gptq", desc_act=True, static_groups=True,
                           format="compressed-tensors").static_groups


@pytest.mark.network   # the library venv is built from PyPI on first use
@pytest.mark.parametrize("case", sorted(W4_CASES))
def test_pack_quantized_loads_in_transformers(tiny, samples, tmp_path, case):  # noqa: F811
    options = QuantizeOptions(format="compressed-tensors", **W4_CASES[case])
    out = tmp_path / "out"
    quantize_checkpoint(tiny, out, options, False, samples)
    library = transformers_forward(out, PROMPT, tmp_path / "run.pt")
    model = _tamis_model(out)
    assert len(library["weights"]) == 14
    for name, weight in library["weights"].items():
        assert torch.equal(_tamis_weight(model, name), weight), name
    torch.testing.assert_close(_tamis_logits(model, PROMPT), library["logits"],
                               atol=1e-5, rtol=0)


@pytest.mark.network
def test_fp8_loads_in_transformers(fp8_checkpoint, tmp_path, monkeypatch):
    out, _ = fp8_checkpoint
    library = transformers_forward(out, PROMPT, tmp_path / "run.pt")
    model = _tamis_model(out)
    assert len(library["weights"]) == 14
    for name, weight in library["weights"].items():
        assert torch.equal(_tamis_weight(model, name), weight), name
    # tamis's CPU path is W8A16; its GPU path quantizes activations per token as
    # compressed-tensors does: run that math here.
    from tamis.quant.fp8 import Fp8LinearMethod
    monkeypatch.setattr(Fp8LinearMethod, "apply", lambda self, layer, x, bias=None:
                        fp8_kernels.fp8_linear_ref(x, layer.weight, layer.weight_scale,
                                                   None, bias))
    torch.testing.assert_close(_tamis_logits(model, PROMPT), library["logits"],
                               atol=1e-4, rtol=0)
