"""GPTQ act-order (``desc_act``: g_idx not monotone) costs nothing in the weights: at load
the input rows are sorted by group once (``finalize_wna16``), so every kernel reads
contiguous groups, and the activations are permuted to match (``wna16_perm``). On the
CPU the logits of an act-order checkpoint equal, bit for bit, those of the same model
written densely with the quantizer's dequantized weights."""
from __future__ import annotations

import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from tamis.quant.quantizer.pipeline import QuantizeOptions, quantize_checkpoint
from test_roundtrip import (PROMPT, _tamis_logits, _tamis_model, samples,  # noqa: F401
                            tiny)

torch.set_num_threads(1)  # tiny shapes: a second thread only adds sync waits


def _dense_copy(source, quantized_dir, weights, target):
    """``quantized_dir``'s model with every quantized linear replaced by its dequantized
    float32 weight: the dequantized reference, loaded by the same engine."""
    shutil.copytree(source, target)
    state = load_file(str(quantized_dir / "model.safetensors"))
    for name in list(state):
        if name.rsplit(".", 1)[0] in weights:
            del state[name]
    state.update({f"{name}.weight": w.dequantize().contiguous() for name, w in weights.items()})
    save_file(state, str(target / "model.safetensors"))
    return target


@pytest.mark.parametrize("sym,bits", [(True, 4), (False, 4), (True, 8)])
def test_act_order_logits_equal_the_dequantized_model_bit_for_bit(tiny, samples, tmp_path,
                                                                 sym, bits):
    options = QuantizeOptions("gptq", bits=bits, group_size=32, desc_act=True, sym=sym,
                              rotate=False)
    result = quantize_checkpoint(tiny, tmp_path / "q", options, False, samples)
    name = "model.layers.1.mlp.down_proj"
    g_idx = result.weights[name].g_idx.long()
    assert not torch.equal(g_idx, g_idx.sort().values)  # a real act order
    quantized = _tamis_model(tmp_path / "q")
    layer = quantized.get_submodule(name)
    perm = layer.wna16_perm
    assert torch.equal(g_idx[perm], torch.arange(g_idx.numel()) // 32)  # sorted once
    assert not hasattr(layer, "g_idx")  # no group lookup left for the forward pass
    dense = _tamis_model(_dense_copy(tiny, tmp_path / "q", result.weights, tmp_path / "d"))
    assert torch.equal(_tamis_logits(quantized, PROMPT), _tamis_logits(dense, PROMPT))
