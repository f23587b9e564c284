"""Checkpoints written by libraries nobody here wrote load in tamis and dequantize to
exactly what the library itself dequantizes to; logits match a transformers model built
from those dequantized weights.

- llm-compressor 0.14: compressed-tensors W4A16 (RTN preset, group 128: the tiny model's
  K is 128 / 256), GPTQ W4A16 (calibrated), FP8_DYNAMIC (per-channel FP8 weights).
- AutoAWQ 0.2.9: AWQ GEMM, group 64, ``apply_clip=False``, with its CPU state-copy bug
  patched (tests/quant/library_quantize.py says how).
The libraries run in their own venv (tests/quant/libraries.py), once per session.

Quality: on the same calibration tokens, tamis's GPTQ (its defaults at llm-compressor's
W4A16 settings: 4-bit, symmetric, group 128) leaves a smaller logit error than
llm-compressor's GPTQ (the regression check beside bench/bench_quant.py's perplexities).
"""
from __future__ import annotations

import os

from pathlib import Path

import pytest
import torch

from libraries import LibraryUnavailable, run_library
from test_roundtrip import PROMPT, SHAPES, _tamis_logits, _tamis_model, _tamis_weight

torch.set_num_threads(1)  # tiny shapes: a second thread only adds sync waits
pytestmark = pytest.mark.network   # the libraries' venv is built from PyPI on first use

CASES = {
    "ct-w4a16": "CTWNA16LinearMethod",
    "ct-gptq-w4a16": "CTWNA16LinearMethod",
    "ct-fp8-dynamic": "Fp8LinearMethod",
    "awq-gemm": "AWQLinearMethod",
}


@pytest.fixture(scope="module")
def lib_model(tiny_checkpoint):
    return tiny_checkpoint("llama", **SHAPES)


def _run(kind: str, model: Path, tmp_path_factory) -> Path:
    out = tmp_path_factory.getbasetemp() / f"library-{kind}"
    try:
        return run_library(kind, model, out)
    except LibraryUnavailable as exc:
        # CI sets TAMIS_REQUIRE_QUANT_LIBS=1: there a missing library is a failure, not a skip.
        if os.environ.get("TAMIS_REQUIRE_QUANT_LIBS") == "1":
            raise
        pytest.skip(f"quantization libraries unavailable (needs PyPI access once): {exc}")


def _reference_model(model_dir: Path, library_dir: Path, dense: dict[str, torch.Tensor]):
    """transformers on the library checkpoint's plain tensors + its dequantized weights."""
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir),
                                             dtype=torch.float32).eval()
    state = {name: t.float() for file in library_dir.glob("model*.safetensors")
             for name, t in load_file(str(file)).items() if name.rsplit(".", 1)[0] not in dense}
    state.update({f"{module}.weight": weight for module, weight in dense.items()})
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    return model


def _reference_logits(model_dir: Path, library_dir: Path, dense: dict[str, torch.Tensor]):
    with torch.no_grad():
        return _reference_model(model_dir, library_dir, dense)(torch.tensor([PROMPT])).logits[0]


@pytest.mark.parametrize("kind", sorted(CASES))
def test_library_checkpoint_matches_library_dequantization(kind, lib_model, tmp_path_factory):
    from safetensors.torch import load_file

    out = _run(kind, lib_model, tmp_path_factory)
    dense = load_file(str(out / "reference" / "dequantized.safetensors"))
    assert len(dense) == 14, sorted(dense)  # 7 linears x 2 layers, lm_head kept dense
    model = _tamis_model(out)
    method = type(model.model.layers[0].self_attn.qkv_proj.quant_method).__name__
    assert method == CASES[kind]
    for module, weight in dense.items():
        assert torch.equal(_tamis_weight(model, module), weight), module
    torch.testing.assert_close(_tamis_logits(model, PROMPT),
                               _reference_logits(lib_model, out, dense), atol=2e-4, rtol=0)


def test_tamis_gptq_beats_llm_compressor_gptq_on_its_calibration(lib_model, tmp_path_factory,
                                                                  tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from library_quantize import CALIBRATION
    from tamis.quant.quantizer.pipeline import QuantizeOptions, quantize_checkpoint
    out = _run("ct-gptq-w4a16", lib_model, tmp_path_factory)
    library = _reference_model(lib_model, out, load_file(
        str(out / "reference" / "dequantized.safetensors")))
    ids = AutoTokenizer.from_pretrained(lib_model)(CALIBRATION)["input_ids"]
    samples = [torch.tensor(ids[i * 64:(i + 1) * 64]) for i in range(4)]  # the library's
    ours = quantize_checkpoint(lib_model, tmp_path / "tamis", QuantizeOptions(
        "gptq", bits=4, group_size=128, sym=True), False, samples).reference_model
    original = AutoModelForCausalLM.from_pretrained(lib_model, dtype=torch.float32).eval()
    tokens = torch.stack(samples)
    with torch.no_grad():
        expected = original(tokens).logits
        errors = {name: (model(tokens).logits - expected).pow(2).mean().item()
                  for name, model in (("tamis", ours), ("llm-compressor", library))}
    assert errors["tamis"] < errors["llm-compressor"], errors
