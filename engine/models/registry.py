"""Model classes keyed by the ``architectures`` entry of config.json."""
from __future__ import annotations

from torch import nn

from tamis.engine.models.gemma2 import Gemma2ForCausalLM
from tamis.engine.models.gemma3 import Gemma3ForCausalLM
from tamis.engine.models.llama import LlamaForCausalLM, MistralForCausalLM
from tamis.engine.models.mixtral import MixtralForCausalLM
from tamis.engine.models.phi3 import Phi3ForCausalLM
from tamis.engine.models.qwen2 import Qwen2ForCausalLM
from tamis.engine.models.qwen3 import Qwen3ForCausalLM
from tamis.engine.models.qwen3_moe import Qwen2MoeForCausalLM, Qwen3MoeForCausalLM

MODEL_REGISTRY: dict[str, type[nn.Module]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": MistralForCausalLM,
    "Qwen2ForCausalLM": Qwen2ForCausalLM,
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
    "Gemma2ForCausalLM": Gemma2ForCausalLM,
    "Gemma3ForCausalLM": Gemma3ForCausalLM,
    "Phi3ForCausalLM": Phi3ForCausalLM,
    "MixtralForCausalLM": MixtralForCausalLM,
    "Qwen2MoeForCausalLM": Qwen2MoeForCausalLM,
    "Qwen3MoeForCausalLM": Qwen3MoeForCausalLM,
}


def supported_architectures() -> list[str]:
    return sorted(MODEL_REGISTRY)


def get_model_class(hf_config) -> type[nn.Module]:
    """The class for the first supported name in ``hf_config.architectures``."""
    architectures = list(getattr(hf_config, "architectures", None) or [])
    for name in architectures:
        if name in MODEL_REGISTRY:
            return MODEL_REGISTRY[name]
    raise ValueError(f"unsupported model architecture {architectures or '(none in config.json)'}; "
                     f"supported: {', '.join(supported_architectures())}")
