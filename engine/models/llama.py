"""Llama and Mistral (the same decoder; Mistral adds a sliding window from its config).

Qwen2 and Qwen3 reuse these blocks with two switches on the attention: q/k/v bias
(``qkv_bias``) and per-head RMSNorm of q and k before rotary (``qk_norm``). Gemma 2/3
and Phi-3 use the other hooks: the norm class, the attention scale and logit soft-cap,
per-layer-type rope (``attention_options``), the decoder layer class, the embedding
scale and the final norm (``model_options``).
"""
from __future__ import annotations

import torch
from torch import nn

from tamis.engine.attention.backends import AttentionBackend
from tamis.engine.attention.kv_scales import KVScaleCollector
from tamis.engine.attention.torch_backend import TorchAttentionBackend
from tamis.engine.distributed.parallel_state import current_pp_group
from tamis.engine.distributed.sharding import materialize
from tamis.engine.layers.activation import get_act_and_mul
from tamis.engine.layers.attention import Attention
from tamis.engine.layers.embedding import LMHead, VocabEmbedding
from tamis.engine.layers.layernorm import RMSNorm
from tamis.engine.layers.linear import MergedColumnLinear, QKVLinear, RowLinear
from tamis.engine.layers.quant_method import QuantizationConfig
from tamis.engine.layers.rotary import CosSinCache, get_rope
from tamis.engine.models.base import CausalLMBase, head_dim_of, layer_sliding_windows


class LlamaMLP(nn.Module):

    def __init__(self, config, quant_config: QuantizationConfig | None, prefix: str,
                 intermediate_size: int | None = None, hidden_act: str | None = None):
        super().__init__()
        size = intermediate_size or config.intermediate_size
        bias = getattr(config, "mlp_bias", False)
        self.gate_up_proj = MergedColumnLinear(config.hidden_size, [size, size], bias,
                                               quant_config, f"{prefix}.gate_up_proj")
        self.down_proj = RowLinear(size, config.hidden_size, bias, quant_config,
                                   f"{prefix}.down_proj")
        self.act_fn = get_act_and_mul(hidden_act or config.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))


class LlamaAttention(nn.Module):

    def __init__(self, config, layer_idx: int, quant_config: QuantizationConfig | None,
                 prefix: str, backend: AttentionBackend, sliding_window: int | None = None,
                 qkv_bias: bool = False, o_bias: bool = False, qk_norm: bool = False,
                 rope_cache: CosSinCache | None = None, rope_layer_type: str | None = None,
                 qk_norm_cls: type[RMSNorm] = RMSNorm, scale: float | None = None,
                 soft_cap: float | None = None):
        """``scale`` defaults to head_dim ** -0.5; ``soft_cap`` caps the attention logits;
        ``rope_layer_type`` picks per-layer-type rope settings (see ``get_rope``)."""
        super().__init__()
        num_heads = config.num_attention_heads
        num_kv_heads = getattr(config, "num_key_value_heads", None) or num_heads
        self.head_dim = head_dim_of(config)
        self.qkv_proj = QKVLinear(config.hidden_size, self.head_dim, num_heads, num_kv_heads,
                                  qkv_bias, quant_config, f"{prefix}.qkv_proj")
        # This rank's heads (all of them on one rank; 1/N of them under tensor parallelism).
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.o_proj = RowLinear(num_heads * self.head_dim, config.hidden_size, o_bias,
                                quant_config, f"{prefix}.o_proj")
        if qk_norm:
            self.q_norm = qk_norm_cls(self.head_dim, config.rms_norm_eps)
            self.k_norm = qk_norm_cls(self.head_dim, config.rms_norm_eps)
        self.qk_norm = qk_norm
        self.rotary_emb = get_rope(config, self.head_dim, rope_layer_type)
        if rope_cache is not None:   # layers of one rope type: compute cos/sin once
            self.rotary_emb.cache = rope_cache
        self.attn = Attention(self.num_heads, self.head_dim, self.num_kv_heads, layer_idx,
                              self.head_dim ** -0.5 if scale is None else scale, backend,
                              sliding_window, soft_cap)

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        q_size, kv_size = self.qkv_proj.q_size, self.qkv_proj.kv_size
        q, k, v = self.qkv_proj(x).split([q_size, kv_size, kv_size], dim=-1)
        q = q.reshape(-1, self.num_heads, self.head_dim)
        k = k.reshape(-1, self.num_kv_heads, self.head_dim)
        v = v.reshape(-1, self.num_kv_heads, self.head_dim)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.rotary_emb(positions, q, k)
        return self.o_proj(self.attn(q, k, v))


def dense_mlp(config, layer_idx: int, quant_config, prefix: str) -> nn.Module:
    """The default MLP factory: every layer gets the gated MLP of ``intermediate_size``."""
    return LlamaMLP(config, quant_config, prefix)


class LlamaDecoderLayer(nn.Module):
    """Attention, then the MLP that ``make_mlp(config, layer_idx, quant_config, prefix)``
    builds, registered as ``mlp_name`` (the checkpoint's name for it)."""

    def __init__(self, config, layer_idx: int, quant_config, prefix: str,
                 backend: AttentionBackend, sliding_window: int | None, make_mlp=dense_mlp,
                 mlp_name: str = "mlp", **attention_options):
        super().__init__()
        self.self_attn = LlamaAttention(config, layer_idx, quant_config, f"{prefix}.self_attn",
                                        backend, sliding_window, **attention_options)
        self.mlp_name = mlp_name
        self.add_module(mlp_name, make_mlp(config, layer_idx, quant_config, f"{prefix}.{mlp_name}"))
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, positions, hidden, residual):
        if residual is None:
            residual, hidden = hidden, self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions, hidden)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return getattr(self, self.mlp_name)(hidden), residual


class LlamaModel(nn.Module):
    """The decoder stack. ``layer_cls`` builds each block (LlamaDecoderLayer's signature),
    ``norm_cls`` the final norm, ``embed_scale`` multiplies the embeddings, and
    ``rope_layer_types[i]`` names layer i's rope settings (None: the config's only ones)."""

    def __init__(self, config, quant_config, backend: AttentionBackend,
                 sliding_windows: list[int | None], prefix: str = "model", make_mlp=dense_mlp,
                 mlp_name: str = "mlp", *, layer_cls: type[nn.Module] = LlamaDecoderLayer,
                 norm_cls: type[RMSNorm] = RMSNorm, embed_scale: float | None = None,
                 rope_layer_types: list[str | None] | None = None, **attention_options):
        super().__init__()
        # A pipeline stage builds its own layers only (the first the embedding, the last the
        # final norm); the others are placeholders that keep the checkpoint's numbering.
        self.pp = pp = current_pp_group()
        stage_layers = pp.layer_range(config.num_hidden_layers)
        self.embed_tokens = (VocabEmbedding(config.vocab_size, config.hidden_size, embed_scale)
                             if pp.is_first else None)
        kinds = rope_layer_types or [None] * config.num_hidden_layers
        # One cos/sin cache per rope type, shared by that type's layers.
        self.rope_caches = {kind: CosSinCache() for kind in dict.fromkeys(kinds)}
        self.layers = nn.ModuleList(
            layer_cls(config, i, quant_config, f"{prefix}.layers.{i}", backend,
                      sliding_windows[i], make_mlp, mlp_name,
                      rope_cache=self.rope_caches[kinds[i]], rope_layer_type=kinds[i],
                      **attention_options) if i in stage_layers else OtherStageLayer()
            for i in range(config.num_hidden_layers))
        self.stage_layers = tuple(self.layers[i] for i in stage_layers)   # not registered twice
        self.norm = norm_cls(config.hidden_size, config.rms_norm_eps) if pp.is_last else None

    def clear_rope_caches(self) -> None:
        for cache in self.rope_caches.values():
            cache.clear()

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                intermediate: tuple[torch.Tensor, torch.Tensor] | None = None):
        """Final hidden states ``[T, H]``; a pipeline stage other than the first starts from
        the previous stage's ``intermediate`` (hidden, residual), and one other than the
        last returns its own."""
        self.clear_rope_caches()
        if intermediate is None:
            hidden, residual = self.embed_tokens(input_ids), None
        else:
            hidden, residual = intermediate
        for layer in self.stage_layers:
            hidden, residual = layer(positions, hidden, residual)
        # Drop the step's cos/sin tables: kept until the next forward, a table sized by the
        # last step's tokens showed as allocated-memory growth between idle points.
        self.clear_rope_caches()
        if not self.pp.is_last:
            return hidden, residual
        hidden, _ = self.norm(hidden, residual)
        return hidden


class OtherStageLayer(nn.Module):
    """Stands for a decoder layer that another pipeline stage holds."""


class LlamaForCausalLM(CausalLMBase):
    packed_modules_mapping = {"qkv_proj": ["q_proj", "k_proj", "v_proj"],
                              "gate_up_proj": ["gate_proj", "up_proj"]}
    mlp_name = "mlp"           # the checkpoint's name for each layer's MLP block
    make_mlp = staticmethod(dense_mlp)   # (config, layer_idx, quant_config, prefix) -> MLP

    def __init__(self, config, quant_config: QuantizationConfig | None = None,
                 attn_backend: AttentionBackend | None = None):
        super().__init__()
        self.config = config
        if quant_config is not None:
            # vLLM convention: the quant config resolves "ignored" lists of unfused names.
            quant_config.packed_modules_mapping = dict(self.packed_modules_mapping)
        backend = attn_backend or TorchAttentionBackend()
        self.model = LlamaModel(config, quant_config, backend, self.sliding_windows(config),
                                make_mlp=self.make_mlp, mlp_name=self.mlp_name,
                                **self.model_options(config), **self.attention_options(config))
        pp = self.model.pp
        tied = bool(getattr(config, "tie_word_embeddings", False))
        # A last pipeline stage without the embedding reads the tied matrix into its own head.
        self.head_reads_embedding = tied and pp.is_last and not pp.is_first
        self.tie_word_embeddings = tied and pp.is_first
        tie_to = self.model.embed_tokens if self.tie_word_embeddings else None
        self.lm_head = LMHead(config.vocab_size, config.hidden_size, tie_to) if pp.is_last else None
        self.other_stage_prefixes = other_stage_prefixes(pp, config.num_hidden_layers)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                intermediate: tuple[torch.Tensor, torch.Tensor] | None = None):
        """As ``LlamaModel.forward``: hidden states, or a pipeline stage's (hidden, residual)."""
        return self.model(input_ids, positions, intermediate)

    def load_weights(self, weights) -> set[str]:
        """The base loader; FP8 KV-cache scales go to the attention layers (kv_scales.py)."""
        collector = KVScaleCollector()
        loaded = super().load_weights(collector.filter(self._stage_weights(weights)))
        collector.apply(self)
        return loaded | collector.names

    def _stage_weights(self, weights):
        """The checkpoint tensors of this pipeline stage (others' layers skipped), read
        whole unless their parameter takes a tensor-parallel slice (then the loader reads
        only the rank's slice of the lazy tensor)."""
        params = dict(self.named_parameters(remove_duplicate=False))
        for name, tensor in weights:
            if self.head_reads_embedding and name == "model.embed_tokens.weight":
                name = "lm_head.weight"
            elif name.startswith(self.other_stage_prefixes):
                continue
            param = params.get(self._target(name)[0])
            if not getattr(param, "reads_checkpoint_slices", False):
                tensor = materialize(tensor)
            yield name, tensor

    @staticmethod
    def attention_options(config) -> dict:
        """Keyword arguments of every layer's LlamaAttention."""
        bias = bool(getattr(config, "attention_bias", False))
        return {"qkv_bias": bias, "o_bias": bias}

    @staticmethod
    def model_options(config) -> dict:
        """Keyword arguments of LlamaModel: layer_cls, norm_cls, embed_scale, ..."""
        return {}

    @staticmethod
    def sliding_windows(config) -> list[int | None]:
        """Per layer window or None. Llama has none, whatever stray keys its config holds
        (transformers' Llama ignores ``sliding_window`` too)."""
        return [None] * config.num_hidden_layers


def other_stage_prefixes(pp, num_layers: int) -> tuple[str, ...]:
    """Checkpoint name prefixes of the modules other pipeline stages hold."""
    own = pp.layer_range(num_layers)
    prefixes = [f"model.layers.{i}." for i in range(num_layers) if i not in own]
    if not pp.is_first:
        prefixes.append("model.embed_tokens.")
    if not pp.is_last:
        prefixes += ["model.norm.", "lm_head."]
    return tuple(prefixes)


class MistralForCausalLM(LlamaForCausalLM):
    """Llama with a sliding window (read from ``config.sliding_window``) and no biases."""

    @staticmethod
    def attention_options(config) -> dict:
        return {}

    @staticmethod
    def sliding_windows(config) -> list[int | None]:
        return layer_sliding_windows(config)
