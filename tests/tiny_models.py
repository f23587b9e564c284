"""Tiny random-weight checkpoints built on the fly with transformers (no model hub).

``make_tiny_checkpoint(arch, path, **config_overrides)`` writes a Hugging Face folder
(config.json, model.safetensors, the SmolLM2 tokenizer files) for one of
``llama | mistral | qwen2 | qwen3``. The vocabulary is SmolLM2's (49152 tokens), so
prompts tokenize normally and the embedded model's tokenizer and chat template apply.

Shapes: hidden 64, 2 layers, 4 query heads / 2 KV heads (GQA), head_dim 16,
intermediate 128. Weights are random from a fixed seed, drawn with a larger std than
transformers' default so greedy decoding has clear winners (no near-ties that fp32
rounding could flip). Mistral gets ``sliding_window=32``; qwen2/qwen3 tie embeddings.
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                   "special_tokens_map.json", "generation_config.json")

_COMMON: dict[str, Any] = dict(
    vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=2048,
    rms_norm_eps=1e-5, initializer_range=0.1, bos_token_id=1, eos_token_id=2, pad_token_id=2,
    hidden_act="silu",
)

_ARCH_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": dict(tie_word_embeddings=False),
    "mistral": dict(tie_word_embeddings=False, sliding_window=32),
    "qwen2": dict(tie_word_embeddings=True),
    "qwen3": dict(tie_word_embeddings=True),
}

SUPPORTED_ARCHS = tuple(_ARCH_DEFAULTS)


def _classes(arch: str):
    import transformers as tf
    return {
        "llama": (tf.LlamaConfig, tf.LlamaForCausalLM),
        "mistral": (tf.MistralConfig, tf.MistralForCausalLM),
        "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM),
        "qwen3": (tf.Qwen3Config, tf.Qwen3ForCausalLM),
    }[arch]


def tiny_config(arch: str, **config_overrides):
    """The transformers config of a tiny ``arch`` model (overrides win)."""
    if arch not in _ARCH_DEFAULTS:
        raise ValueError(f"unknown tiny arch {arch!r}; choose one of {SUPPORTED_ARCHS}")
    config_cls, _ = _classes(arch)
    kwargs = {**_COMMON, **_ARCH_DEFAULTS[arch], **config_overrides}
    return config_cls(**kwargs)


def make_tiny_checkpoint(arch: str, path: str | Path, seed: int = 0, with_tokenizer: bool = True,
                         **config_overrides) -> Path:
    """Builds a random tiny ``arch`` model (fixed ``seed``) and saves it as an HF folder.
    ``with_tokenizer=False`` skips the SmolLM2 tokenizer files (and the embedded model)."""
    import torch
    from transformers.utils import logging as hf_logging

    from tamis.engine.embedded import default_model_path

    hf_logging.disable_progress_bar()   # one bar per saved tiny model drowns test output
    path = Path(path)
    config = tiny_config(arch, **config_overrides)
    _, model_cls = _classes(arch)
    torch.manual_seed(seed)
    model = model_cls(config).to(torch.float32).eval()
    config.dtype = "float32"
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    if not with_tokenizer:
        return path
    source = default_model_path()
    for name in TOKENIZER_FILES:
        if (source / name).exists():
            shutil.copy(source / name, path / name)
    return path
