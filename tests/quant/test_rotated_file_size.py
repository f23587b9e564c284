"""What the rotated GPTQ default writes besides the quantized linears.

Rotating the residual stream unties the head from the embedding (the head takes the final
norm's weights folded in), so the rotated checkpoint holds one more vocab x hidden matrix
than the plain one. Both it and the embedding are written in 16 bits: the file grows by
that one 16-bit matrix, not by two float32 ones (a float32 source wrote 285 MB against
113 MB for SmolLM2-135M). The written model loads in tamis's engine and generates the
quantizer's reference model's greedy tokens.
"""
from __future__ import annotations

import json

import pytest
import torch

from formats import greedy_pair
from tamis.quant.quantizer.pipeline import QuantizeOptions, quantize_checkpoint

torch.set_num_threads(1)
SHAPES = dict(hidden_size=128, intermediate_size=256, head_dim=32)
CALIBRATION = ("The rotated checkpoint keeps its embedding and its untied head in sixteen "
               "bits, so the file grows by one matrix and not by two float32 ones. ") * 12


@pytest.fixture(scope="module")
def tiny(tiny_checkpoint):
    # Tied, as SmolLM2 is: the plain checkpoint then stores one matrix for both.
    return tiny_checkpoint("llama", tie_word_embeddings=True, **SHAPES)


@pytest.fixture(scope="module")
def samples(tiny):
    from transformers import AutoTokenizer
    ids = AutoTokenizer.from_pretrained(tiny)(CALIBRATION, return_tensors="pt")["input_ids"][0]
    return [ids[:32], ids[32:64]]


def _file_bytes(folder) -> int:
    return (folder / "model.safetensors").stat().st_size


def test_rotated_default_grows_by_one_16_bit_head_and_generates(tiny, samples, tmp_path):
    config = json.loads((tiny / "config.json").read_text())
    assert config["tie_word_embeddings"] is True
    assert config.get("dtype", config.get("torch_dtype")) in (None, "float32")  # worst case
    rotated = quantize_checkpoint(tiny, tmp_path / "rotated",
                                  QuantizeOptions("gptq", group_size=64), False, samples)
    quantize_checkpoint(tiny, tmp_path / "plain",
                        QuantizeOptions("gptq", group_size=64, rotate=False), False, samples)
    assert json.loads((tmp_path / "rotated" / "config.json").read_text())[
        "tie_word_embeddings"] is False
    head_16_bit = config["vocab_size"] * config["hidden_size"] * 2
    growth = _file_bytes(tmp_path / "rotated") - _file_bytes(tmp_path / "plain")
    # The safetensors headers differ by the head's entry: a few hundred bytes.
    assert head_16_bit <= growth <= head_16_bit + 1024, (growth, head_16_bit)

    prompts = [list(range(300, 310)), list(range(500, 517))]
    ours, theirs = greedy_pair(tmp_path / "rotated", rotated.reference_model.eval(), prompts)
    assert ours == theirs
