"""Tokenizer loading and the small helpers the engine needs around it.

The tokenizer is Hugging Face's (``AutoTokenizer``), loaded from the model folder or
``--tokenizer``. EOS ids come from the tokenizer, ``config.json`` and
``generation_config.json`` (chat models often end turns with a token other than the
tokenizer's EOS).
"""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

import tokenizers


def load_tokenizer(path: str | Path, trust_remote_code: bool = False):
    """``AutoTokenizer`` for ``path``; a clear error when the folder has no tokenizer."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path), trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot load a tokenizer from {path}: {exc} "
                         "(pass --tokenizer to point at a folder with tokenizer files)") from exc


def eos_token_ids(tokenizer: Any, hf_config: Any = None, model_dir: str | Path | None = None) -> set[int]:
    """Every token id that ends generation unless ``ignore_eos``."""
    ids: set[int] = set()
    for source in (getattr(tokenizer, "eos_token_id", None), getattr(hf_config, "eos_token_id", None),
                   _generation_config_eos(model_dir)):
        if isinstance(source, int):
            ids.add(source)
        elif isinstance(source, (list, tuple)):
            ids.update(int(i) for i in source)
    return ids


def _generation_config_eos(model_dir: str | Path | None):
    if model_dir is None:
        return None
    path = Path(model_dir) / "generation_config.json"
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text()).get("eos_token_id")
    except (OSError, ValueError):
        return None


# Where transformers defines the ``decode`` / ``_decode`` of a plain fast tokenizer
# (``_decode`` moved from tokenization_utils_fast to tokenization_utils_tokenizers in 5.0).
_BASE_DECODE_MODULE = "transformers.tokenization_utils_base"
_FAST_DECODE_MODULES = ("transformers.tokenization_utils_tokenizers",
                        "transformers.tokenization_utils_fast")


def id_decoder(tokenizer: Any) -> Callable[[list[int], bool], str]:
    """``decode(ids, skip_special_tokens)``: the text ``tokenizer.decode`` returns, through
    the Rust tokenizer itself where that is the same text (a fast tokenizer whose class
    keeps transformers' own decode and does not clean up spaces). transformers' wrapper
    costs about twice the decode of the short windows incremental detokenization decodes,
    two for every generated token (SmolLM2's tokenizer: 6.8 -> 2.2 us a window)."""
    backend = getattr(tokenizer, "_tokenizer", None)
    if (isinstance(backend, tokenizers.Tokenizer)
            and not getattr(tokenizer, "clean_up_tokenization_spaces", True)
            and _defined_in(tokenizer, "decode") == _BASE_DECODE_MODULE
            and _defined_in(tokenizer, "_decode") in _FAST_DECODE_MODULES):
        return lambda ids, skip_special_tokens: backend.decode(
            ids, skip_special_tokens=skip_special_tokens)
    return lambda ids, skip_special_tokens: tokenizer.decode(
        ids, skip_special_tokens=skip_special_tokens)


def _defined_in(obj: Any, method: str) -> str | None:
    """The module of the class in ``obj``'s MRO that defines ``method``."""
    owner = next((cls for cls in type(obj).__mro__ if method in vars(cls)), None)
    return owner.__module__ if owner is not None else None


class TokenDecoder:
    """Decodes single tokens for logprob entries, cached (vLLM's ``decoded_token``)."""

    def __init__(self, tokenizer: Any) -> None:
        decode = id_decoder(tokenizer)
        self._decode = lru_cache(maxsize=1 << 16)(lambda token_id: decode([token_id], False))

    def __call__(self, token_id: int) -> str:
        return self._decode(int(token_id))


__all__ = ["load_tokenizer", "eos_token_ids", "id_decoder", "TokenDecoder"]
