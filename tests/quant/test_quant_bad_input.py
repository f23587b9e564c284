"""Broken quantized checkpoints fail at load time with an error naming the tensor or layer
and the problem, before any request could be served."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tamis.kernels import fp8 as fp8_kernels
from tamis.quant.quantizer.pipeline import QuantizeOptions, quantize_checkpoint
from test_roundtrip import _tamis_model

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def gptq_dir(tiny_checkpoint, tmp_path_factory):
    out = tmp_path_factory.mktemp("bad") / "gptq"
    quantize_checkpoint(tiny_checkpoint("llama"), out,
                        QuantizeOptions("gptq", bits=4, group_size=32, rtn=True), False)
    return out


def _edited_copy(source: Path, target: Path, edit) -> Path:
    target.mkdir()
    for file in source.iterdir():
        if file.suffix != ".safetensors":
            (target / file.name).write_bytes(file.read_bytes())
    state = load_file(str(source / "model.safetensors"))
    edit(state)
    save_file(state, str(target / "model.safetensors"))
    return target


def test_missing_tensor_is_named(gptq_dir, tmp_path):
    broken = _edited_copy(gptq_dir, tmp_path / "m", lambda s: s.pop(
        "model.layers.1.self_attn.k_proj.qzeros"))
    with pytest.raises(ValueError, match=r"missing tensor.*model.layers.1.self_attn.k_proj.qzeros"):
        _tamis_model(broken)


def test_wrong_shape_is_named(gptq_dir, tmp_path):
    def edit(state):
        state["model.layers.0.mlp.up_proj.scales"] = state["model.layers.0.mlp.up_proj.scales"][:1]
    broken = _edited_copy(gptq_dir, tmp_path / "w", edit)
    with pytest.raises(ValueError, match=r"model.layers.0.mlp.up_proj.scales.*shape \(1, 128\)"):
        _tamis_model(broken)


def test_unsupported_setting_in_config_is_named(gptq_dir, tmp_path):
    broken = _edited_copy(gptq_dir, tmp_path / "c", lambda s: None)
    config = json.loads((broken / "config.json").read_text())
    config["quantization_config"]["bits"] = 3
    (broken / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"GPTQ checkpoint has bits=3; tamis supports \(4, 8\)"):
        _tamis_model(broken)


def test_forced_method_mismatch_is_named(gptq_dir):
    from types import SimpleNamespace

    from tamis.engine.loader import load_model
    config = SimpleNamespace(model=str(gptq_dir), dtype="float32", load_format="auto",
                             quantization="awq", seed=0, attention_backend="torch")
    with pytest.raises(ValueError, match=r"'awq' was requested but the checkpoint is quantized "
                                         r"with 'gptq'"):
        load_model(config, "cpu")


def test_gpu_without_fp8_falls_back_to_w8a16(monkeypatch):
    """No FP8 tensor cores (e.g. an A100): FP8 weights run as W8A16, same numbers as the
    upcast weight; only CPU and CUDA devices are accepted for FP8 layers."""
    from tamis.quant.fp8 import check_fp8_device
    monkeypatch.setattr(fp8_kernels, "fp8_supported", lambda device: False)
    weight = (torch.randn(32, 64) * 0.05).to(fp8_kernels.FP8_DTYPE)
    scale = torch.rand(32) + 0.5
    x = torch.randn(3, 64)
    expected = x @ (weight.float() * scale[:, None]).t()
    torch.testing.assert_close(fp8_kernels.fp8_linear(x, weight, scale), expected)
    layer = torch.nn.Module()
    layer.prefix = "model.layers.4.mlp.down_proj"
    with pytest.raises(ValueError, match=r"model.layers.4.mlp.down_proj: FP8 weights are "
                                         r"supported on CPU and CUDA devices, not 'meta'"):
        check_fp8_device(layer, torch.device("meta"))
