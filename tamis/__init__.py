"""tamis: an LLM serving engine (paged KV cache, continuous batching, structured outputs).

    from tamis import LLM, SamplingParams
    outputs = LLM().generate(["Hello, my name is"], SamplingParams(temperature=0, max_tokens=16))

Names are imported on first use, so ``import tamis`` stays cheap and one subpackage's
missing optional dependency never breaks the others.
"""
from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "LLM": "tamis.engine.llm",
    "LLMEngine": "tamis.engine.engine",
    "BeamSearchParams": "tamis.engine.beam_search",
    "EngineConfig": "tamis.engine.config",
    "SamplingParams": "tamis.engine.sampling_params",
    "RequestOutputKind": "tamis.engine.sampling_params",
    "RequestOutput": "tamis.engine.outputs",
    "CompletionOutput": "tamis.engine.outputs",
    "Logprob": "tamis.engine.outputs",
    "StructuredOutputsParams": "tamis.constrain",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def _checkout_root() -> Path | None:
    """The repository folder when this package is read from a source checkout, else None.

    A wheel holds the subpackages inside ``tamis/``; a checkout keeps them beside it
    (``engine/``, ``quant/``, ...). Links are resolved, so the link tree of an editable
    install leads back to the checkout."""
    here = Path(__file__).resolve().parent
    if (here / "engine").is_dir() or not (here.parent / "pyproject.toml").is_file():
        return None
    return here.parent


# In a checkout (an editable install, or a Python started at the repository root),
# ``tamis.engine`` and its siblings are found in the folders beside this one, so a module
# added there imports without reinstalling. The price: other folders of the checkout
# (``tamis.bench``, ``tamis.tests``) are importable too, which no code does.
if (_root := _checkout_root()) is not None:
    __path__ = [str(Path(__file__).resolve().parent), str(_root)]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'tamis' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
