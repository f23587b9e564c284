"""Rotation of the residual stream before quantization (QuaRot's and SpinQuant's R1, done
offline): the model computes the same function, but its linears' weights are spread over
every channel, so a group holds fewer outliers and a symmetric grid fits it better.

For an orthogonal Q (Q Q^T = I), a Llama-style decoder computes the same logits with its
residual stream h replaced by h Q:

```
embed_tokens      E      -> E Q
RMSNorm weight    g      -> 1, g folded into the linears that read the norm (W diag(g))
q/k/v, gate/up    W      -> W diag(g) Q        (they read the normed h Q)
o_proj, down_proj W, b   -> Q^T W, b Q         (they write into h Q)
lm_head           W      -> W diag(g_final) Q  (untied from E when it was tied)
```

RMSNorm(h Q) = RMSNorm(h) Q because Q keeps every row's norm; the norm's weight cannot
stay (diag(g) does not commute with Q), hence the fold. The result is a plain checkpoint
of the same architecture (norm weights of ones, ``tie_word_embeddings`` false) that any
engine loads. Q is a randomized Hadamard matrix: random signs times the Kronecker product
of a random orthogonal matrix for the odd part of the hidden size with a Sylvester
Hadamard matrix for its power-of-two part. The products run in float64 on the device
given (a block of rows at a time; the model stays where it is).
"""
from __future__ import annotations

import torch
from torch import nn

_READ_NORM = {"input_layernorm": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
              "post_attention_layernorm": ("mlp.gate_proj", "mlp.up_proj")}
_WRITE_RESIDUAL = ("self_attn.o_proj", "mlp.down_proj")
# Architectures whose norms are plain RMSNorm (x / rms(x) * g: Gemma's x / rms(x) * (1 + g)
# would fold wrongly under the same module names).
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
_PROBE_IDS = torch.arange(1, 17)[None, :]  # the tokens of the logits check


def residual_rotation(size: int, seed: int = 0) -> torch.Tensor:
    """An orthogonal [size, size] float64 matrix: random signs x kron(random orthogonal of
    the odd part of ``size``, normalized Sylvester Hadamard of its power-of-two part)."""
    generator = torch.Generator().manual_seed(seed)
    power = size & -size  # the largest power of two dividing size
    hadamard = torch.ones(1, 1, dtype=torch.float64)
    while hadamard.shape[0] < power:
        hadamard = torch.cat([torch.cat([hadamard, hadamard], 1),
                              torch.cat([hadamard, -hadamard], 1)])
    odd = size // power
    q, r = torch.linalg.qr(torch.randn(odd, odd, dtype=torch.float64, generator=generator))
    odd_part = q * torch.sign(torch.diagonal(r))  # Haar-distributed, not just orthogonal
    signs = torch.randint(0, 2, (size,), generator=generator).to(torch.float64) * 2 - 1
    return signs[:, None] * torch.kron(odd_part.contiguous(), hadamard / power ** 0.5)


@torch.no_grad()
def rotate_residual(model: nn.Module, seed: int = 0, device: torch.device | str = "cpu"
                    ) -> None:
    """Rotates the residual stream of a transformers Llama / Mistral / Qwen2 / Qwen3
    causal LM in place (module docstring): same logits up to float rounding, norm weights
    of ones, ``lm_head`` its own tensor and ``config.tie_word_embeddings`` false. The
    products run on ``device``, each weight's rows moved there and back in blocks. Raises
    ValueError on another architecture or layout (naming what is missing), and if the
    logits of a few tokens changed after all (``_check_same_logits``)."""
    inner, layers = _check_layout(model)
    probe = _PROBE_IDS.to(inner.embed_tokens.weight.device)
    before = model(probe).logits
    q = residual_rotation(model.config.hidden_size, seed).to(device)
    _rotate(model, inner, layers, q)
    _check_same_logits(before, model(probe).logits)


def _rotate(model: nn.Module, inner: nn.Module, layers, q: torch.Tensor) -> None:
    """The module docstring's table, applied in place with Q = ``q``."""
    head = model.lm_head
    model.lm_head = nn.Linear(head.in_features, head.out_features, bias=False,
                              dtype=head.weight.dtype, device=head.weight.device)
    _rotate_rows(model.lm_head.weight, head.weight, q, inner.norm.weight)
    model.config.tie_word_embeddings = False
    inner.norm.weight.fill_(1.0)
    embed = inner.embed_tokens.weight
    _rotate_rows(embed, embed, q)
    for layer in layers:
        for norm_name, readers in _READ_NORM.items():
            norm = layer.get_submodule(norm_name)
            for name in readers:
                weight = layer.get_submodule(name).weight
                _rotate_rows(weight, weight, q, norm.weight)
            norm.weight.fill_(1.0)
        for name in _WRITE_RESIDUAL:
            linear = layer.get_submodule(name)
            linear.weight.copy_(q.t() @ linear.weight.to(q.device, torch.float64))
            if linear.bias is not None:
                linear.bias.copy_(linear.bias.to(q.device, torch.float64) @ q)


def _rotate_rows(out: torch.Tensor, weight: torch.Tensor, q: torch.Tensor,
                 norm_weight: torch.Tensor | None = None, rows: int = 8192) -> None:
    """out = weight diag(norm_weight) Q, in float64 on Q's device a block of ``rows`` rows
    at a time: a vocabulary-sized matrix (128k rows for Llama 3) is never copied whole in
    float64. ``out`` may be ``weight`` itself."""
    for start in range(0, weight.shape[0], rows):
        block = weight[start:start + rows].to(q.device, torch.float64)
        if norm_weight is not None:
            block = block * norm_weight.to(q.device, torch.float64)[None, :]
        out[start:start + rows] = (block @ q).to(out.device, out.dtype)


def _check_same_logits(before: torch.Tensor, after: torch.Tensor) -> None:
    """The rotation must not change what the model computes: anything past float
    rounding means a norm or layer this module does not know."""
    change = float((after - before).abs().max())
    if change > 1e-3 * float(before.abs().max()):
        raise ValueError(f"--rotate changed this model's logits by up to {change:.3g}: its "
                         "norms or layers are not the Llama-style ones it folds; "
                         "quantize with --no-rotate")


def supports_rotation(config) -> bool:
    """Whether a model of this transformers config is one ``rotate_residual`` folds right
    (``SUPPORTED_MODEL_TYPES``)."""
    return getattr(config, "model_type", None) in SUPPORTED_MODEL_TYPES


def _check_layout(model: nn.Module):
    """(model.model, its decoder layers) where the layout is the one rotated here."""
    if not supports_rotation(model.config):
        raise ValueError(f"--rotate supports {', '.join(SUPPORTED_MODEL_TYPES)} models; this "
                         f"one is {getattr(model.config, 'model_type', None)!r}: quantize "
                         "with --no-rotate")
    inner = getattr(model, "model", None)
    missing = [name for name in ("model.embed_tokens", "model.norm", "model.layers", "lm_head")
               if not _has(model, name)]
    if not missing:
        names = [*_READ_NORM, *(n for readers in _READ_NORM.values() for n in readers),
                 *_WRITE_RESIDUAL]
        for index, layer in enumerate(inner.layers):
            missing += [f"model.layers.{index}.{n}" for n in names if not _has(layer, n)]
    if missing:
        raise ValueError(f"--rotate supports Llama-style decoders (Llama, Mistral, Qwen2, "
                         f"Qwen3); this model has no {', '.join(missing[:4])}")
    if getattr(inner.norm, "bias", None) is not None:
        raise ValueError("--rotate: model.norm has a bias (LayerNorm); RMSNorm models only")
    return inner, inner.layers


def _has(module: nn.Module, name: str) -> bool:
    try:
        module.get_submodule(name)
    except AttributeError:
        return False
    return True
