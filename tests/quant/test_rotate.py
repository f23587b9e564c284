"""The residual-stream rotation `tamis quantize --rotate` applies before quantizing
(quant/quantizer/rotate.py): an orthogonal matrix, the same logits after it on every
supported architecture, and a clear refusal elsewhere."""
from __future__ import annotations

import pytest
import torch

from tamis.quant.quantizer.rotate import (SUPPORTED_MODEL_TYPES, residual_rotation,
                                          rotate_residual)
from tiny_models import SUPPORTED_ARCHS, tiny_model

torch.set_num_threads(1)


@pytest.mark.parametrize("size", [1, 7, 64, 96, 576])
def test_rotation_is_orthogonal_and_dense(size):
    q = residual_rotation(size, seed=3)
    torch.testing.assert_close(q @ q.t(), torch.eye(size, dtype=torch.float64),
                               atol=1e-12, rtol=0)
    if size > 1:  # every output channel mixes every input channel
        assert bool((q != 0).all())
    assert torch.equal(q, residual_rotation(size, seed=3))
    assert not torch.equal(q, residual_rotation(size, seed=4)) or size == 1


def _tiny_model(arch: str, **overrides):
    model = tiny_model(arch, num_hidden_layers=2, **overrides)
    with torch.no_grad():  # norms that are not all ones, so that folding them matters
        for name, parameter in model.named_parameters():
            if name.endswith("norm.weight"):
                parameter.uniform_(0.5, 1.5)
            elif name.endswith("bias"):
                parameter.normal_(0, 0.1)
    return model


ROTATED_ARCHS = [a for a in SUPPORTED_ARCHS if a in SUPPORTED_MODEL_TYPES]


@pytest.mark.parametrize("arch", ROTATED_ARCHS)
def test_rotation_keeps_the_logits(arch):
    model = _tiny_model(arch)
    ids = torch.randint(0, model.config.vocab_size, (1, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        before = model(ids).logits
        rotate_residual(model, seed=0)
        after = model(ids).logits
    torch.testing.assert_close(after, before, atol=2e-4, rtol=1e-4)
    assert model.config.tie_word_embeddings is False
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    norms = [p for n, p in model.named_parameters() if n.endswith("layernorm.weight")
             or n == "model.norm.weight"]
    assert len(norms) == 2 * 2 + 1 and all(bool((p == 1).all()) for p in norms)


def test_rotation_spreads_an_outlier_channel():
    """The point of the rotation: a hidden channel 30x the others no longer sets the
    scale of every group of q_proj's rows."""
    model = _tiny_model("llama")
    with torch.no_grad():
        model.model.layers[0].self_attn.q_proj.weight[:, 5] *= 30
        weight = model.model.layers[0].self_attn.q_proj.weight.detach().clone()
        weight = weight * model.model.layers[0].input_layernorm.weight
        rotate_residual(model)
    rotated = model.model.layers[0].self_attn.q_proj.weight.detach()

    def peak_to_rms(w):
        return float((w.abs().amax(dim=1) / w.pow(2).mean(dim=1).sqrt()).mean())

    assert peak_to_rms(rotated) < peak_to_rms(weight) / 2


def test_rotation_refuses_another_layout():
    model = _tiny_model("llama")
    del model.model.layers[1].mlp.down_proj
    with pytest.raises(ValueError, match=r"model\.layers\.1\.mlp\.down_proj"):
        rotate_residual(model)


def test_rotation_refuses_another_architecture():
    model = _tiny_model("llama")
    model.config.model_type = "gemma"  # its norms scale by 1 + g: folding g would be wrong
    with pytest.raises(ValueError, match="this one is 'gemma': quantize with --no-rotate"):
        rotate_residual(model)


@pytest.mark.parametrize("arch", [a for a in SUPPORTED_ARCHS if a not in ROTATED_ARCHS])
def test_rotation_refuses_the_other_served_architectures(arch):
    """MoE experts and Gemma's (1 + g) norms are outside the fold: refused, not rotated."""
    model = _tiny_model(arch)
    with pytest.raises(ValueError, match="quantize with --no-rotate"):
        rotate_residual(model)


def test_rotation_checks_the_logits_it_keeps():
    """A norm that is not plain RMSNorm under the expected names (here a per-channel
    scale after it, which the fold does not see) is caught by the logits check."""
    model = _tiny_model("llama")
    scale = torch.linspace(0.5, 1.5, model.config.hidden_size)
    model.model.layers[0].input_layernorm.register_forward_hook(lambda _m, _a, out: out * scale)
    with pytest.raises(ValueError, match="changed this model's logits"):
        rotate_residual(model)
