"""tamis: an LLM serving engine (paged KV cache, continuous batching, structured outputs).

    from tamis import LLM, SamplingParams
    outputs = LLM().generate(["Hello, my name is"], SamplingParams(temperature=0, max_tokens=16))

Names are imported on first use, so ``import tamis`` stays cheap and one room's missing
optional dependency never breaks the others.
"""
from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "LLM": "tamis.engine.llm",
    "LLMEngine": "tamis.engine.engine",
    "EngineConfig": "tamis.engine.config",
    "SamplingParams": "tamis.engine.sampling_params",
    "RequestOutputKind": "tamis.engine.sampling_params",
    "RequestOutput": "tamis.engine.outputs",
    "CompletionOutput": "tamis.engine.outputs",
    "Logprob": "tamis.engine.outputs",
    "StructuredOutputsParams": "tamis.constrain",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'tamis' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
