"""Which quantization a checkpoint uses, and the config object that loads it.

Sources, first found wins: ``config.json`` ``quantization_config``; AutoGPTQ's legacy
``quantize_config.json``; AutoAWQ's legacy ``quant_config.json``. A forced method
(``--quantization`` / ``LLM(quantization=...)``) must agree with the checkpoint, except
``fp8`` on an unquantized checkpoint, which quantizes it while loading (online FP8).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tamis.engine.layers.quant_method import QuantizationConfig
from tamis.quant.awq import AWQConfig
from tamis.quant.compressed_tensors import CompressedTensorsConfig
from tamis.quant.fp8 import Fp8Config
from tamis.quant.fp8_block import Fp8BlockConfig
from tamis.quant.gptq import GPTQConfig

QUANTIZATION_METHODS: dict[str, type] = {
    "awq": AWQConfig,
    "gptq": GPTQConfig,
    "fp8": Fp8Config,
    "compressed-tensors": CompressedTensorsConfig,
}
_ALIASES = {"compressed_tensors": "compressed-tensors"}
_LEGACY_FILES = ("quantize_config.json", "quant_config.json")


def normalize_method(name: str) -> str:
    return _ALIASES.get(name.lower(), name.lower())


def get_quant_config(model_dir: str | Path, hf_config: Any,
                     quantization: str | None) -> QuantizationConfig | None:
    """The checkpoint's quantization (None for a plain checkpoint without ``quantization``).

    Raises ValueError saying what the checkpoint has and what tamis supports when the
    method or one of its settings is unsupported, or when ``quantization`` disagrees with
    the checkpoint."""
    supported = ", ".join(QUANTIZATION_METHODS)
    forced = normalize_method(quantization) if quantization else None
    if forced is not None and forced not in QUANTIZATION_METHODS:
        raise ValueError(f"unknown quantization {quantization!r}; tamis supports {supported}")
    found = read_checkpoint_quant_config(Path(model_dir), hf_config)
    if found is None:
        if forced is None:
            return None
        if forced == "fp8":
            return Fp8Config(is_checkpoint_fp8_serialized=False)
        raise ValueError(f"quantization={quantization!r} needs a checkpoint quantized with "
                         f"{forced}, but {model_dir} is not quantized (only 'fp8' can quantize "
                         f"an unquantized checkpoint while loading)")
    method = found.get("quant_method")
    if method not in QUANTIZATION_METHODS:
        raise ValueError(f"the checkpoint is quantized with {found.get('quant_method')!r}; "
                         f"tamis supports {supported}")
    if forced is not None and forced != method:
        raise ValueError(f"quantization={quantization!r} was requested but the checkpoint is "
                         f"quantized with {method!r}; drop the flag or pass {method!r}")
    if method == "fp8" and found.get("weight_block_size") is not None:
        return Fp8BlockConfig.from_config(found)   # DeepSeek / Qwen3 block-wise FP8
    return QUANTIZATION_METHODS[method].from_config(found)


def read_checkpoint_quant_config(model_dir: Path, hf_config: Any) -> dict[str, Any] | None:
    """The raw quantization settings with a normalized ``quant_method``, or None."""
    config = _as_dict(getattr(hf_config, "quantization_config", None)
                      if not isinstance(hf_config, dict) else hf_config.get("quantization_config"))
    if config is None:
        config = _legacy_config(model_dir)
    if config is None:
        return None
    config = dict(config)
    method = config.get("quant_method")
    config["quant_method"] = normalize_method(str(method)) if method else _guess_method(config)
    return config


def _as_dict(config: Any) -> dict[str, Any] | None:
    if config is None or isinstance(config, dict):
        return config
    if hasattr(config, "to_dict"):
        return config.to_dict()
    return dict(vars(config))


def _legacy_config(model_dir: Path) -> dict[str, Any] | None:
    for name in _LEGACY_FILES:
        path = model_dir / name
        if path.is_file():
            config = json.loads(path.read_text())
            if name == "quantize_config.json":
                config.setdefault("quant_method", "gptq")
            return config
    return None


def _guess_method(config: dict[str, Any]) -> str:
    if "w_bit" in config or "q_group_size" in config or "zero_point" in config:
        return "awq"
    if "desc_act" in config or "bits" in config:
        return "gptq"
    return str(config.get("quant_method"))
