"""What every causal LM here shares: config helpers, weight loading, logits.

Checkpoint names map onto parameters one to one, except the fused layers a model
declares in ``packed_modules_mapping`` (vLLM's form)::

    {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}

``...self_attn.k_proj.weight`` is loaded into ``...self_attn.qkv_proj.weight`` as shard 1
(the position in the list) by that parameter's ``weight_loader``.

Mixture-of-experts models stack their experts per layer and declare, per projection name
of the checkpoint's per-expert tensors, the stack and shard it goes to
(``expert_weight_names``)::

    {"w1": ("w13", 0), "w3": ("w13", 1), "w2": ("w2", 0)}

``...experts.5.w3.weight`` is loaded into ``...experts.w13_weight`` with shard id (5, 1);
a quantized checkpoint's ``...experts.5.w3.qweight`` into ``...experts.w13_qweight``.
Some writers name the same projections otherwise; ``expert_weight_aliases`` maps such a
name to the declared one (llm-compressor's Mixtral: ``{"gate_proj": "w1", ...}``), and
the checkpoint then counts as holding the declared names.
"""
from __future__ import annotations

import re
from typing import Iterable

import torch
from torch import nn

# Tensors some checkpoints carry that are recomputed here, never loaded.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq", "rotary_emb.cos_cached", "rotary_emb.sin_cached")
_EXPERT_TENSOR = re.compile(
    r"(?P<block>.+\.experts)\.(?P<expert>\d+)\.(?P<proj>\w+)\.(?P<tensor>\w+)")


def head_dim_of(hf_config) -> int:
    return getattr(hf_config, "head_dim", None) or \
        hf_config.hidden_size // hf_config.num_attention_heads


def layer_sliding_windows(hf_config) -> list[int | None]:
    """Per layer: the sliding window (tokens a query sees, itself included) or None."""
    n = hf_config.num_hidden_layers
    window = getattr(hf_config, "sliding_window", None)
    layer_types = getattr(hf_config, "layer_types", None)
    if layer_types is not None:
        return [window if kind == "sliding_attention" else None for kind in layer_types[:n]]
    if getattr(hf_config, "use_sliding_window", True) is False or not window:
        return [None] * n
    # Qwen2-style configs without layer_types: layers from max_window_layers on slide.
    qwen_style = hasattr(hf_config, "use_sliding_window")
    first = getattr(hf_config, "max_window_layers", 0) if qwen_style else 0
    return [window if i >= first else None for i in range(n)]


def default_weight_loader(param: torch.Tensor, loaded: torch.Tensor) -> None:
    if param.shape != loaded.shape:
        raise ValueError(f"checkpoint tensor has shape {tuple(loaded.shape)}, "
                         f"the parameter expects {tuple(param.shape)}")
    param.data.copy_(loaded)


class CausalLMBase(nn.Module):
    """Subclasses set ``self.model`` (returns final hidden states), ``self.lm_head`` and
    ``self.tie_word_embeddings``."""

    packed_modules_mapping: dict[str, list[str]] = {}
    expert_weight_names: dict[str, tuple[str, int]] = {}   # proj -> ("w13" | "w2", shard)
    expert_weight_aliases: dict[str, str] = {}   # another writer's proj -> a declared proj

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, H] -> float32 logits [N, vocab]."""
        return self.lm_head(hidden)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """input_ids, positions int64 [T] -> hidden [T, H] (attention reads the forward context)."""
        return self.model(input_ids, positions)

    def _declared_name(self, name: str) -> str:
        """``name`` with an aliased expert projection renamed to the declared one."""
        expert = _EXPERT_TENSOR.fullmatch(name)
        if expert is None or expert["proj"] not in self.expert_weight_aliases:
            return name
        proj = self.expert_weight_aliases[expert["proj"]]
        return f"{expert['block']}.{expert['expert']}.{proj}.{expert['tensor']}"

    def _target(self, name: str) -> tuple[str, int | tuple[int, int] | None]:
        """(parameter name, shard id) for a checkpoint tensor name."""
        expert = _EXPERT_TENSOR.fullmatch(self._declared_name(name))
        if expert and expert["proj"] in self.expert_weight_names:
            stack, shard = self.expert_weight_names[expert["proj"]]
            param = f"{stack}_{expert['tensor']}"
            return f"{expert['block']}.{param}", (int(expert["expert"]), shard)
        parts = name.split(".")
        for fused, shards in self.packed_modules_mapping.items():
            for shard_id, shard in enumerate(shards):
                if shard in parts[:-1]:
                    parts[parts.index(shard)] = fused
                    return ".".join(parts), shard_id
        return name, None

    def expected_checkpoint_names(self) -> set[str]:
        """Checkpoint tensor names this model needs (fused parameters listed per shard)."""
        names = set()
        for name, param in self.named_parameters():
            per_expert = self._expert_checkpoint_names(name, param.shape[0])
            if per_expert:
                names.update(per_expert)
                continue
            parts = name.split(".")
            fused = next((p for p in parts[:-1] if p in self.packed_modules_mapping), None)
            if fused is None:
                names.add(name)
                continue
            for shard in self.packed_modules_mapping[fused]:
                names.add(".".join(shard if p == fused else p for p in parts))
        return names

    def _expert_checkpoint_names(self, name: str, num_experts: int) -> list[str]:
        """The per-expert checkpoint names of a stacked expert parameter; [] for others."""
        block, _, param = name.rpartition(".")
        if not block.endswith("experts"):
            return []
        stack, _, tensor = param.partition("_")
        projections = [proj for proj, (stacked, _) in self.expert_weight_names.items()
                       if stacked == stack]
        return [f"{block}.{expert}.{proj}.{tensor}" for expert in range(num_experts)
                for proj in projections]

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Loads (name, tensor) pairs; returns the checkpoint names loaded.

        Raises ValueError naming the tensor for a name the model has no parameter for,
        or a shape that does not fit. Missing tensors: see ``check_all_loaded``.
        """
        params = dict(self.named_parameters(remove_duplicate=False))
        loaded = set()
        for name, tensor in weights:
            if name.endswith(_IGNORED_SUFFIXES):
                continue
            if self.tie_word_embeddings and name == "lm_head.weight":
                continue  # some tied checkpoints store the shared matrix twice
            target, shard_id = self._target(name)
            param = params.get(target)
            if param is None:
                raise ValueError(f"unexpected tensor {name!r} in the checkpoint: "
                                 f"{type(self).__name__} has no parameter {target!r}")
            loader = getattr(param, "weight_loader", None)
            try:
                if loader is None:
                    default_weight_loader(param, tensor)
                elif shard_id is None:
                    loader(param, tensor)
                else:
                    loader(param, tensor, shard_id)
            except ValueError as exc:
                raise ValueError(f"cannot load tensor {name!r}: {exc}") from exc
            loaded.add(self._declared_name(name))
        return loaded

    def check_all_loaded(self, loaded: set[str]) -> None:
        """Raises ValueError naming the checkpoint tensors that were never loaded."""
        missing = sorted(self.expected_checkpoint_names() - loaded)
        if missing:
            shown = ", ".join(repr(m) for m in missing[:8])
            more = f" and {len(missing) - 8} more" if len(missing) > 8 else ""
            raise ValueError(f"checkpoint is missing tensor(s) {shown}{more}")

    def process_weights_after_loading(self) -> None:
        """Lets each layer's linear method repack what it loaded (once, after loading)."""
        for module in self.modules():
            method = getattr(module, "quant_method", None)
            if method is not None:
                method.process_weights_after_loading(module)
