"""Broken quantized checkpoints fail at load time with an error naming the tensor or layer
and the problem, before any request could be served; a truncated safetensors file ends
`tamis serve`, `tamis generate`, `tamis quantize` and ``LLM(...)`` in one line naming the
file; a compressed-tensors setting tamis does not run is named when the config is read."""
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


# ------------------------------------------------------------------ truncated safetensors

@pytest.fixture(scope="module")
def truncated_dir(gptq_dir, tmp_path_factory):
    """The GPTQ checkpoint with its safetensors file cut in half (an interrupted copy)."""
    target = tmp_path_factory.mktemp("truncated") / "gptq"
    target.mkdir()
    for file in gptq_dir.iterdir():
        data = file.read_bytes()
        (target / file.name).write_bytes(data[:len(data) // 2] if file.suffix == ".safetensors"
                                         else data)
    return target


def _one_line_naming_the_file(message: str, folder: Path) -> None:
    assert "\n" not in message
    assert str(folder / "model.safetensors") in message
    assert "not a complete safetensors file" in message


def test_truncated_file_is_named_by_the_loader(truncated_dir):
    from tamis.engine.loader import CheckpointFileError
    with pytest.raises(CheckpointFileError) as info:
        _tamis_model(truncated_dir)
    _one_line_naming_the_file(str(info.value), truncated_dir)


def test_truncated_file_is_named_by_llm(truncated_dir):
    from tamis.engine.llm import LLM
    with pytest.raises(ValueError) as info:
        LLM(model=str(truncated_dir), dtype="float32")
    _one_line_naming_the_file(str(info.value), truncated_dir)


def test_truncated_file_ends_tamis_serve_in_one_line(truncated_dir):
    from tamis.cli import build_parser
    from tamis.commands.serve import _load
    args = build_parser().parse_args(["serve", str(truncated_dir)])
    args.model = args.model_tag
    with pytest.raises(SystemExit) as info:
        _load(args, None)
    message = str(info.value.code)
    assert message.startswith("tamis serve: ")
    _one_line_naming_the_file(message, truncated_dir)


@pytest.mark.parametrize("command", ["generate", "quantize"])
def test_truncated_file_ends_the_cli_in_one_line(truncated_dir, tmp_path, capsys, command):
    from tamis.cli import main
    argv = (["generate", "--model", str(truncated_dir), "hello", "--max-tokens", "1"]
            if command == "generate" else
            ["quantize", str(truncated_dir), "--method", "gptq", "--rtn", "--output",
             str(tmp_path / "out")])
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"tamis {command}: ")
    _one_line_naming_the_file(err, truncated_dir)
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------ compressed-tensors configs

def _ct(weights: dict, fmt: str = "pack-quantized", acts: dict | None = None, **group) -> dict:
    return {"quant_method": "compressed-tensors", "format": fmt,
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights,
                                          "input_activations": acts, **group}}}


W4 = {"type": "int", "num_bits": 4, "strategy": "group", "group_size": 128, "symmetric": True}
FP8 = {"type": "float", "num_bits": 8, "strategy": "channel", "symmetric": True}
TOKEN_FP8 = {"type": "float", "num_bits": 8, "strategy": "token", "dynamic": True}


@pytest.mark.parametrize("config,message", [
    (_ct({**W4, "group_size": 48}), r"group_size=48 \(strategy 'group': \(32, 64, 128\)"),
    (_ct({**W4, "group_size": None}), r"group_size=None"),
    (_ct({**W4, "group_size": "128"}), r"group_size='128'"),
    (_ct({**W4, "num_bits": 3}), r"num_bits=3 \(pack-quantized: \(4, 8\)\)"),
    (_ct({**W4, "strategy": "tensor"}), r"weight strategy 'tensor'"),
    (_ct({**W4, "type": "fp4"}), r"weight type 'fp4'"),
    (_ct({**W4, "actorder": "sometimes"}), r"actorder='sometimes'"),
    (_ct(W4, fmt="marlin-24"), r"format 'marlin-24' for int weights"),
    (_ct({**W4, "dynamic": True}), r"weights dynamic=True"),
    (_ct(W4, output_activations=TOKEN_FP8), r"quantized output activations"),
    (_ct({**FP8, "num_bits": 4}, "float-quantized", TOKEN_FP8), r"float weights num_bits=4"),
    (_ct({**FP8, "strategy": "block"}, "float-quantized", TOKEN_FP8),
     r"float weights strategy='block'"),
    (_ct({**FP8, "symmetric": False}, "float-quantized", TOKEN_FP8), r"asymmetric float"),
    (_ct(FP8, "float-quantized", {**TOKEN_FP8, "strategy": "group"}),
     r"dynamic activation strategy 'group'"),
    (_ct(FP8, "pack-quantized", TOKEN_FP8), r"format 'pack-quantized' for float weights"),
])
def test_compressed_tensors_config_names_the_setting(tmp_path, config, message):
    """Checked when the config is read, as GPTQ / AWQ settings are, so the error names the
    setting rather than a tensor shape it leads to."""
    from tamis.quant import get_quant_config
    with pytest.raises(ValueError, match=r"config group 'group_0' has " + message):
        get_quant_config(tmp_path, {"quantization_config": config}, None)


@pytest.mark.parametrize("actorder,act_order", [(None, False), ("weight", False),
                                                ("static", False), ("group", True),
                                                ("dynamic", True)])
def test_compressed_tensors_actorder_aliases(tmp_path, actorder, act_order):
    """compressed-tensors writes weight_g_idx for actorder "group" and its alias
    "dynamic"; "weight" / "static" keep groups contiguous (no g_idx)."""
    from tamis.quant import get_quant_config
    config = get_quant_config(tmp_path, {"quantization_config": _ct({**W4, "actorder": actorder})},
                              None)
    assert config.get_linear_method("model.layers.0.mlp.down_proj").act_order is act_order
