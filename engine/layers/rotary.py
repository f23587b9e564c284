"""Rotary position embeddings (RoPE), neox layout (rotate halves), as Llama/Qwen/Mistral use.

``get_rope(hf_config, head_dim)`` reads the scaling from the config. Transformers >= 5
stores it as ``config.rope_parameters`` (``rope_type``, ``rope_theta``, ``factor``, ...);
older configs carry ``rope_scaling`` (key ``type`` or ``rope_type``) and ``rope_theta``.
Supported types: default, linear, llama3, yarn, dynamic, longrope. Others raise
ValueError naming the type. Dynamic NTK scaling only changes the frequencies for positions past
``max_position_embeddings`` (transformers recomputes them there); the engine never goes
that far (``max_model_len`` is capped at it), so inside that range it is the default.

LongRoPE (Phi-3): transformers switches from the short to the long factors once a
sequence outgrows ``original_max_position_embeddings``, and recomputes the whole cache
when it does. A paged cache shared by prefix hits cannot change its rope midway, so here
the choice is made once per model: the long factors when the checkpoint's
``max_position_embeddings`` exceeds the original length (vLLM's rule, with its default
``max_model_len``), else the short ones. The cos/sin scaling is transformers' attention
factor, ``sqrt(1 + ln(factor) / ln(original))`` unless the config gives one.

Models with per-layer rope settings (Gemma 3: ``rope_parameters`` keyed by layer type,
``full_attention`` and ``sliding_attention``; older configs: ``rope_local_base_freq``
for the sliding layers) pass the ``layer_type`` to ``get_rope``.

cos/sin are computed from the positions in float32 (``positions x inv_freq``, the same
product transformers forms), so there is no length limit and no table to size. The layers
of a model share one ``CosSinCache`` (their rotary modules are identical), which keeps the
cos/sin of the last positions tensor seen (the same object): a forward pass computes them
once instead of once per layer. The model clears it at the start of each pass, so a
positions buffer rewritten in place between passes is never read stale.
"""
from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn", "dynamic", "longrope")


def rope_parameters(hf_config, layer_type: str | None = None) -> dict[str, Any]:
    """The config's rope settings (those of ``layer_type`` where they differ per layer
    type) as one dict with ``rope_type`` and ``rope_theta`` set."""
    params = dict(getattr(hf_config, "rope_parameters", None) or {})
    if isinstance(params.get(layer_type), dict):
        params = dict(params[layer_type])
    elif layer_type == "sliding_attention" and getattr(hf_config, "rope_local_base_freq", None):
        return {"rope_type": "default", "rope_theta": hf_config.rope_local_base_freq}
    scaling = getattr(hf_config, "rope_scaling", None)
    if not params and isinstance(scaling, dict):
        params = dict(scaling)
    params.setdefault("rope_type", params.get("type", "default"))
    if params.get("rope_theta") is None:
        params["rope_theta"] = getattr(hf_config, "rope_theta", None) or 10000.0
    if getattr(hf_config, "partial_rotary_factor", None) is not None:
        params.setdefault("partial_rotary_factor", hf_config.partial_rotary_factor)
    if params["rope_type"] in ("llama3", "yarn", "longrope"):
        params.setdefault("original_max_position_embeddings",
                          getattr(hf_config, "original_max_position_embeddings", None)
                          or hf_config.max_position_embeddings)
    return params


def _default_inv_freq(dim: int, theta: float) -> torch.Tensor:
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def _llama3_inv_freq(dim: int, p: dict[str, Any]) -> torch.Tensor:
    inv_freq = _default_inv_freq(dim, p["rope_theta"])
    factor, low, high = p["factor"], p["low_freq_factor"], p["high_freq_factor"]
    old_len = p["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn_inv_freq(dim: int, p: dict[str, Any], max_position: int) -> tuple[torch.Tensor, float]:
    """YaRN (arXiv 2309.00071): interpolate low frequencies, keep high ones, scale cos/sin."""
    base, old_len = p["rope_theta"], p["original_max_position_embeddings"]
    factor = p.get("factor") or max_position / old_len
    attention_factor = p.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all_dim = p.get("mscale"), p.get("mscale_all_dim")
        if mscale and mscale_all_dim:
            attention_factor = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
        else:
            attention_factor = _yarn_mscale(factor)
    beta_fast, beta_slow = p.get("beta_fast") or 32, p.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return dim * math.log(old_len / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if p.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolation_weight = 1 - ramp
    pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation_weight) \
        + (1.0 / pos_freqs) * extrapolation_weight
    return inv_freq, float(attention_factor)


def _longrope_inv_freq(dim: int, p: dict[str, Any],
                       max_position: int) -> tuple[torch.Tensor, float]:
    """LongRoPE (Phi-3): per-frequency divisors, long or short (see the module docstring)."""
    old_len = p["original_max_position_embeddings"]
    factor = p.get("factor") or max_position / old_len
    attention_factor = p.get("attention_factor")
    if attention_factor is None:
        attention_factor = 1.0 if factor <= 1.0 else \
            math.sqrt(1 + math.log(factor) / math.log(old_len))
    name = "long_factor" if max_position > old_len else "short_factor"
    divisors = torch.tensor(p[name], dtype=torch.float32)
    if divisors.shape != (dim // 2,):
        raise ValueError(f"rope {name} has {divisors.numel()} entries; the rotary dimension "
                         f"{dim} needs {dim // 2}")
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    return 1.0 / (divisors * p["rope_theta"] ** exponents), float(attention_factor)


def compute_inv_freq(rotary_dim: int, params: dict[str, Any],
                     max_position: int) -> tuple[torch.Tensor, float]:
    """(inv_freq [rotary_dim // 2] float32, cos/sin scaling) for the rope type in ``params``."""
    rope_type = params["rope_type"]
    if rope_type in ("default", "dynamic"):
        return _default_inv_freq(rotary_dim, params["rope_theta"]), 1.0
    if rope_type == "linear":
        return _default_inv_freq(rotary_dim, params["rope_theta"]) / params["factor"], 1.0
    if rope_type == "llama3":
        return _llama3_inv_freq(rotary_dim, params), 1.0
    if rope_type == "yarn":
        return _yarn_inv_freq(rotary_dim, params, max_position)
    if rope_type == "longrope":
        return _longrope_inv_freq(rotary_dim, params, max_position)
    raise ValueError(f"unsupported rope type {rope_type!r}; supported: {SUPPORTED_ROPE_TYPES}")


class CosSinCache:
    """cos/sin of one positions tensor, shared by rotary modules with the same frequencies.

    An entry is keyed by the positions tensor (identity), the dtype and the table's
    ``layout``: the torch path keeps [T, 1, R] cos and sin, the fused kernel one [T, R/2]
    table, and a lookup must never hand one to the other."""

    def __init__(self):
        self._entry: tuple | None = None   # (positions, dtype, layout, value)

    def clear(self) -> None:
        """Forgets the entry; called before the layers of each forward pass and after
        them, so that no table outlives its step."""
        self._entry = None

    @property
    def empty(self) -> bool:
        return self._entry is None

    def get(self, positions: torch.Tensor, dtype: torch.dtype, layout: str, compute):
        """The table for ``positions`` (the same tensor object) in ``dtype`` and ``layout``;
        ``compute()`` makes it on a miss."""
        entry = self._entry
        if (entry is not None and entry[0] is positions and entry[1] == dtype
                and entry[2] == layout):
            return entry[3]
        value = compute()
        self._entry = (positions, dtype, layout, value)
        return value


class RotaryEmbedding(nn.Module):
    """Rotates q [T, Hq, D] and k [T, Hk, D] by their positions [T] (first ``rotary_dim`` dims)."""

    def __init__(self, head_dim: int, rotary_dim: int, inv_freq: torch.Tensor,
                 attention_scaling: float = 1.0):
        super().__init__()
        self.head_dim = head_dim
        self.rotary_dim = rotary_dim
        self.attention_scaling = attention_scaling
        self.register_buffer("inv_freq", inv_freq.float(), persistent=False)
        # Replace by the model's shared cache (only among modules of equal inv_freq/scaling).
        self.cache = CosSinCache()

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos() * self.attention_scaling, emb.sin() * self.attention_scaling

    def forward(self, positions: torch.Tensor, q: torch.Tensor,
                k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns rotated (q, k); on CUDA they are rotated in place by one fused kernel
        (``tamis.kernels.rotary``), on CPU new tensors are returned."""
        if q.is_cuda:
            return self.forward_fused(positions, q, k)
        cos, sin = self.cache.get(positions, q.dtype, "torch",
                                  lambda: self._cos_sin_as(positions, q.dtype))
        return self._rotate(q, cos, sin), self._rotate(k, cos, sin)

    def forward_fused(self, positions: torch.Tensor, q: torch.Tensor,
                      k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The kernels subpackage's in-place rotary (Triton on CUDA, its reference
        elsewhere), with the cos/sin table [T, rotary_dim // 2] computed once per pass and
        shared by the layers."""
        from tamis.kernels.rotary import rotary_cos_sin, rotary_embedding_
        if q.stride(-1) != 1 or k.stride(-1) != 1:
            q, k = q.contiguous(), k.contiguous()
        cos_sin = self.cache.get(positions, q.dtype, "fused", lambda: rotary_cos_sin(
            positions, self.inv_freq, self.attention_scaling, q.dtype))
        return rotary_embedding_(positions, q, k, self.inv_freq, self.attention_scaling,
                                 cos_sin=cos_sin)

    def _cos_sin_as(self, positions: torch.Tensor,
                    dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [T, 1, rotary_dim] in ``dtype``, ready to broadcast over heads."""
        cos, sin = self.cos_sin(positions)
        return cos.to(dtype)[:, None, :], sin.to(dtype)[:, None, :]

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        rot, rest = x[..., :self.rotary_dim], x[..., self.rotary_dim:]
        half = self.rotary_dim // 2
        rotated_half = torch.cat((-rot[..., half:], rot[..., :half]), dim=-1)
        out = rot * cos + rotated_half * sin
        return out if rest.shape[-1] == 0 else torch.cat((out, rest), dim=-1)


def get_rope(hf_config, head_dim: int, layer_type: str | None = None) -> RotaryEmbedding:
    """The rotary embedding ``hf_config`` asks for (for layers of ``layer_type`` where the
    settings differ per layer type); ValueError for an unsupported type."""
    params = rope_parameters(hf_config, layer_type)
    rotary_dim = int(head_dim * params.get("partial_rotary_factor", 1.0))
    inv_freq, scaling = compute_inv_freq(rotary_dim, params, hf_config.max_position_embeddings)
    return RotaryEmbedding(head_dim, rotary_dim, inv_freq, scaling)
