"""Tiny random-weight checkpoints built on the fly with transformers (no model hub).

``make_tiny_checkpoint(arch, path, **config_overrides)`` writes a Hugging Face folder
(config.json, model.safetensors, the SmolLM2 tokenizer files) for one of
``llama | mistral | qwen2 | qwen3 | mixtral | qwen2_moe | qwen3_moe | gemma2 | gemma3 |
phi3``. The vocabulary
is SmolLM2's (49152 tokens), so prompts tokenize normally and the embedded model's
tokenizer and chat template apply.

Shapes: hidden 64, 2 layers, 4 query heads / 2 KV heads (GQA), head_dim 16,
intermediate 128. Weights are random from a fixed seed, drawn with a larger std than
transformers' default so greedy decoding has clear winners (no near-ties that fp32
rounding could flip). Mistral gets ``sliding_window=32``; qwen2/qwen3 tie embeddings.
The MoE models have 4 experts, 2 per token (expert intermediate 32); qwen3_moe's first
layer is a dense MLP (``mlp_only_layers=[0]``) and it renormalises the top-k weights;
qwen2_moe adds a shared expert (intermediate 48) and does not renormalise.
gemma2 alternates sliding (window 16) and global layers, soft-caps attention logits at
2 and final logits at 30, and scales queries by ``query_pre_attn_scalar=24`` (not
head_dim); gemma3 has 6 layers (5 sliding, window 16, then 1 global), a local rope
theta of 10^4 and a linearly scaled global rope; both draw their norms' ``w`` of
``(1 + w)`` at random (transformers starts them at 0, which would hide a missing 1).
phi3 stores fused qkv_proj / gate_up_proj; ``LONGROPE`` overrides give it LongRoPE.
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
    "mixtral": dict(tie_word_embeddings=False, num_local_experts=4, num_experts_per_tok=2,
                    intermediate_size=32, sliding_window=None),
    "qwen2_moe": dict(tie_word_embeddings=False, num_experts=4, num_experts_per_tok=2,
                      moe_intermediate_size=32, shared_expert_intermediate_size=48,
                      norm_topk_prob=False),
    "qwen3_moe": dict(tie_word_embeddings=False, num_experts=4, num_experts_per_tok=2,
                      moe_intermediate_size=32, norm_topk_prob=True, mlp_only_layers=[0]),
    "gemma2": dict(tie_word_embeddings=True, hidden_activation="gelu_pytorch_tanh",
                   sliding_window=16, query_pre_attn_scalar=24, attn_logit_softcapping=2.0,
                   final_logit_softcapping=30.0),
    "gemma3": dict(tie_word_embeddings=True, hidden_activation="gelu_pytorch_tanh",
                   num_hidden_layers=6, sliding_window=16, query_pre_attn_scalar=24,
                   rope_parameters={
                       "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                       "full_attention": {"rope_type": "linear", "factor": 4.0,
                                          "rope_theta": 1000000.0}}),
    "phi3": dict(tie_word_embeddings=False, sliding_window=None),
}

# Phi-3.5-style LongRoPE on the tiny phi3 (rotary dim 16: 8 factors each). The checkpoint's
# context (2048) exceeds the original one (64), so the long factors apply.
LONGROPE = dict(original_max_position_embeddings=64, rope_parameters={
    "rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": 64,
    "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.1, 3.8],
    "long_factor": [1.0, 1.5, 2.5, 4.0, 6.0, 9.0, 13.0, 18.0]})

_RANDOM_NORM_ARCHS = ("gemma2", "gemma3")

SUPPORTED_ARCHS = tuple(_ARCH_DEFAULTS)


def _classes(arch: str):
    import transformers as tf
    return {
        "llama": (tf.LlamaConfig, tf.LlamaForCausalLM),
        "mistral": (tf.MistralConfig, tf.MistralForCausalLM),
        "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM),
        "qwen3": (tf.Qwen3Config, tf.Qwen3ForCausalLM),
        "mixtral": (tf.MixtralConfig, tf.MixtralForCausalLM),
        "qwen2_moe": (tf.Qwen2MoeConfig, tf.Qwen2MoeForCausalLM),
        "qwen3_moe": (tf.Qwen3MoeConfig, tf.Qwen3MoeForCausalLM),
        "gemma2": (tf.Gemma2Config, tf.Gemma2ForCausalLM),
        "gemma3": (tf.Gemma3TextConfig, tf.Gemma3ForCausalLM),
        "phi3": (tf.Phi3Config, tf.Phi3ForCausalLM),
    }[arch]


def tiny_config(arch: str, **config_overrides):
    """The transformers config of a tiny ``arch`` model (overrides win)."""
    if arch not in _ARCH_DEFAULTS:
        raise ValueError(f"unknown tiny arch {arch!r}; choose one of {SUPPORTED_ARCHS}")
    config_cls, _ = _classes(arch)
    kwargs = {**_COMMON, **_ARCH_DEFAULTS[arch], **config_overrides}
    return config_cls(**kwargs)


def tiny_model(arch: str, seed: int = 0, **config_overrides):
    """A random tiny ``arch`` transformers model (fixed ``seed``), fp32, in eval mode."""
    import torch

    config = tiny_config(arch, **config_overrides)
    _, model_cls = _classes(arch)
    torch.manual_seed(seed)
    model = model_cls(config).to(torch.float32).eval()
    if arch in _RANDOM_NORM_ARCHS:
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.endswith("norm.weight"):
                    param.normal_(0.0, 0.3)
    return model


def make_tiny_checkpoint(arch: str, path: str | Path, seed: int = 0, with_tokenizer: bool = True,
                         **config_overrides) -> Path:
    """Builds a random tiny ``arch`` model (``tiny_model``) and saves it as an HF folder.
    ``with_tokenizer=False`` skips the SmolLM2 tokenizer files (and the embedded model)."""
    from transformers.utils import logging as hf_logging

    from tamis.engine.embedded import default_model_path

    hf_logging.disable_progress_bar()   # one bar per saved tiny model drowns test output
    path = Path(path)
    model = tiny_model(arch, seed, **config_overrides)
    model.config.dtype = "float32"
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    if not with_tokenizer:
        return path
    source = default_model_path()
    for name in TOKENIZER_FILES:
        if (source / name).exists():
            shutil.copy(source / name, path / name)
    return path


def _llama_cpp_permute(weight, num_heads: int):
    """llama.cpp's q/k row order (interleaved rotary halves); transformers undoes it on load."""
    rows = weight.shape[0]
    return (weight.reshape(num_heads, 2, rows // num_heads // 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))


def make_tiny_gguf(path: str | Path, seed: int = 0) -> tuple[Path, Any]:
    """Writes a tiny random Llama as an F32 GGUF file with a byte-level BPE vocabulary of
    261 tokens (3 specials, 256 bytes, 2 merges: the GGUF tokenizer converts in a blink).
    Returns (gguf path, the transformers model it was written from)."""
    import gguf
    import torch

    config = tiny_config("llama", vocab_size=261, tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = _classes("llama")[1](config).float().eval()
    path = Path(path)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_rope_dimension_count(config.head_dim)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    writer.add_tokenizer_model("gpt2")
    tokens = ["<unk>", "<s>", "</s>"] + _byte_level_alphabet() + ["Ġt", "he"]
    writer.add_token_list(tokens)
    writer.add_token_types([3, 3, 3] + [1] * (len(tokens) - 3))
    writer.add_token_merges(["Ġ t", "h e"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    for name, tensor in _gguf_tensors(model, config):
        writer.add_tensor(name, tensor.detach().float().numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path, model


def _byte_level_alphabet() -> list[str]:
    """GPT-2's printable stand-in for each of the 256 bytes (byte-level BPE)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    extra = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(extra)) for b in range(256)]


def _gguf_tensors(model, config):
    state = model.state_dict()
    yield "token_embd.weight", state["model.embed_tokens.weight"]
    yield "output_norm.weight", state["model.norm.weight"]
    yield "output.weight", state["lm_head.weight"]
    names = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
             "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for i in range(config.num_hidden_layers):
        for hf_name, gguf_name in names.items():
            tensor = state[f"model.layers.{i}.{hf_name}.weight"]
            if gguf_name == "attn_q":
                tensor = _llama_cpp_permute(tensor, config.num_attention_heads)
            elif gguf_name == "attn_k":
                tensor = _llama_cpp_permute(tensor, config.num_key_value_heads)
            yield f"blk.{i}.{gguf_name}.weight", tensor
