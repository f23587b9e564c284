"""Model shapes (config.json only, no weights) for the GPU benchmarks: the dense
Llama-3.1-8B and two mixture-of-experts models.

``write_shape_config(shape, folder)`` writes a ``config.json`` that tamis and vLLM load
with ``load_format="dummy"`` and transformers builds with random weights. Each shape
reproduces the architecture fields of a published checkpoint's config.json; generation
defaults and training-only fields are left out. No tokenizer: the benchmarks feed token
ids drawn below ``prompt_vocab(shape)``.

Sizes in bf16 (weights alone): Llama-3.1-8B 16 GB; Qwen3-30B-A3B 61 GB (fits one 80 GB
GPU); Mixtral-8x7B 93 GB (fits one 80 GB GPU only quantized, e.g. ``--quantization fp8``).
"""
from __future__ import annotations

import json
from pathlib import Path

# meta-llama/Llama-3.1-8B config.json
LLAMA_31_8B = dict(
    architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=128256,
    hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
    num_key_value_heads=8, head_dim=128, hidden_act="silu", max_position_embeddings=131072,
    rms_norm_eps=1e-5, rope_theta=500000.0,
    rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                      original_max_position_embeddings=8192),
    attention_bias=False, mlp_bias=False, tie_word_embeddings=False, torch_dtype="bfloat16",
    bos_token_id=128000, eos_token_id=128001, initializer_range=0.02,
)

# Qwen/Qwen3-30B-A3B config.json: 48 layers, each a sparse MoE block of 128 experts
# (intermediate 768), 8 routed per token with renormalised weights; q/k RMSNorm (Qwen3);
# 30.5B parameters, 3.3B active. ``intermediate_size`` is the dense MLP's, which no layer
# uses (``mlp_only_layers`` is empty).
QWEN3_30B_A3B = dict(
    architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", vocab_size=151936,
    hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
    num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
    num_experts=128, num_experts_per_tok=8, norm_topk_prob=True, decoder_sparse_step=1,
    mlp_only_layers=[], hidden_act="silu", max_position_embeddings=40960, rms_norm_eps=1e-6,
    rope_theta=1000000.0, rope_scaling=None, attention_bias=False, use_sliding_window=False,
    sliding_window=None, max_window_layers=48, tie_word_embeddings=False,
    torch_dtype="bfloat16", bos_token_id=151643, eos_token_id=151645, initializer_range=0.02,
    router_aux_loss_coef=0.001,
)

# mistralai/Mixtral-8x7B-v0.1 config.json (the Instruct-v0.1 release has the same
# architecture): Mistral's decoder with 8 experts of intermediate 14336 per layer, 2 routed
# per token (softmax over the top 2); no sliding window; 46.7B parameters, 12.9B active.
MIXTRAL_8X7B = dict(
    architectures=["MixtralForCausalLM"], model_type="mixtral", vocab_size=32000,
    hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
    num_key_value_heads=8, head_dim=128, num_local_experts=8, num_experts_per_tok=2,
    hidden_act="silu", max_position_embeddings=32768, rms_norm_eps=1e-5,
    rope_theta=1000000.0, sliding_window=None, tie_word_embeddings=False,
    torch_dtype="bfloat16", bos_token_id=1, eos_token_id=2, initializer_range=0.02,
    router_aux_loss_coef=0.02,
)

SHAPES = {"llama-3.1-8b": LLAMA_31_8B, "qwen3-30b-a3b": QWEN3_30B_A3B,
          "mixtral-8x7b": MIXTRAL_8X7B}
DEFAULT_SHAPE = "llama-3.1-8b"
_LABELS = {"llama-3.1-8b": "Llama-3.1-8B", "qwen3-30b-a3b": "Qwen3-30B-A3B",
           "mixtral-8x7b": "Mixtral-8x7B"}

# Llama-3's ids from 128000 on are special tokens; every shape's prompts stay below it
# (and below its own vocabulary), so the Llama-3.1-8B prompts are the ones they always were.
_PROMPT_VOCAB_LIMIT = 128000


def _check_shape(shape: str) -> None:
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; --shape takes one of {', '.join(SHAPES)}")


def shape_config(shape: str, **overrides) -> dict:
    """The shape's config.json fields, ``overrides`` replacing or adding fields."""
    _check_shape(shape)
    return {**SHAPES[shape], **overrides}


def write_shape_config(shape: str, folder: str | Path, **overrides) -> Path:
    """Writes ``shape_config(shape, **overrides)`` to ``folder/config.json``; returns
    ``folder`` (created if missing)."""
    config = shape_config(shape, **overrides)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    return folder


def prompt_vocab(shape: str) -> int:
    """Random prompt ids are drawn from [0, prompt_vocab(shape))."""
    _check_shape(shape)
    return min(_PROMPT_VOCAB_LIMIT, SHAPES[shape]["vocab_size"])


def add_shape_args(parser) -> None:
    """``--shape`` (default Llama-3.1-8B) and ``--quantization`` (the engines' own name
    for it, passed to tamis and vLLM alike; ``fp8``: online FP8 of the bf16 weights)."""
    parser.add_argument("--shape", choices=sorted(SHAPES), default=DEFAULT_SHAPE,
                        help="model shape, dummy weights (default: %(default)s)")
    parser.add_argument("--quantization", default=None,
                        help="passed to tamis and vLLM, e.g. fp8 (online FP8 weights); "
                             "default: none, bf16 weights")


def describe(shape: str, quantization: str | None = None) -> str:
    """'Mixtral-8x7B shape, dummy bf16 weights, --quantization fp8' for table headers."""
    _check_shape(shape)
    weights = "dummy bf16 weights"
    if quantization:
        weights += f", --quantization {quantization}"
    return f"{_LABELS[shape]} shape, {weights}"
