"""Calibration data and the layer-by-layer replay that GPTQ and AWQ need.

Calibration runs the model's own transformers implementation (a quantization tool, not
the serving path): the inputs of decoder layer 0 are captured once, then each layer is
replayed on them with the keyword arguments transformers passed it (rotary embeddings,
mask), so a layer's quantization sees the outputs of the already-quantized layers.

Replays run on the device of the layer's parameters; the windows may live elsewhere (the
host, when they do not fit on the device: ``device.activation_home``) and are moved over
one at a time.
"""
from __future__ import annotations

import importlib
from typing import Callable

import torch
from torch import nn

from tamis.quant.quantizer.device import module_device, onloaded

# Default calibration text: docstrings of standard-library modules (ships with Python and
# is not pydoc_data.topics, the text the perplexity benchmark measures on).
_DOC_MODULES = ("argparse", "asyncio", "collections", "csv", "datetime", "decimal", "email",
                "functools", "heapq", "http.client", "inspect", "itertools", "json", "logging",
                "os", "pathlib", "pickle", "random", "re", "shutil", "socket", "sqlite3",
                "statistics", "string", "subprocess", "tarfile", "threading", "typing",
                "unittest", "urllib.parse", "uuid", "zipfile")


def default_calibration_text() -> str:
    parts = []
    for name in _DOC_MODULES:
        module = importlib.import_module(name)
        parts.append(module.__doc__ or "")
        for attr in sorted(vars(module)):
            doc = getattr(getattr(module, attr), "__doc__", None)
            if isinstance(doc, str) and len(doc) > 200 and not attr.startswith("_"):
                parts.append(doc)
    return "\n\n".join(parts)


def calibration_samples(tokenizer, text: str, num_samples: int, seq_len: int) -> list[torch.Tensor]:
    """Consecutive ``seq_len``-token windows of ``text`` (fewer if the text is short)."""
    ids = tokenizer(text, return_tensors="pt")["input_ids"][0]
    count = min(num_samples, ids.numel() // seq_len)
    if count == 0:
        raise ValueError(f"calibration text has {ids.numel()} tokens; need at least "
                         f"seq_len={seq_len}")
    return [ids[i * seq_len:(i + 1) * seq_len] for i in range(count)]


class _Captured(Exception):
    pass


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__}: no model.layers; tamis quantize supports "
                         f"decoder-only models laid out like Llama")
    return layers


@torch.no_grad()
def capture_layer_inputs(model: nn.Module, samples: list[torch.Tensor],
                         device: torch.device | str = "cpu", home: torch.device | str = "cpu"
                         ) -> tuple[list[torch.Tensor], dict]:
    """The hidden states entering layer 0 for each sample (on ``home``), and the other
    kwargs it got (rotary embeddings, mask: on ``device``). The modules before the decoder
    layers (embeddings, rotary) run on ``device`` and go back to the host after; the
    layers themselves are never run."""
    inputs: list[torch.Tensor] = []
    kwargs_seen: dict = {}

    def hook(_module, args, kwargs):
        inputs.append((args[0] if args else kwargs["hidden_states"]).to(home))
        kwargs_seen.update({k: v for k, v in kwargs.items() if k != "hidden_states"})
        raise _Captured

    layers = decoder_layers(model)
    before_layers = [m for m in model.model.children() if m is not layers]
    handle = layers[0].register_forward_pre_hook(hook, with_kwargs=True)
    try:
        with onloaded(before_layers, device):
            for sample in samples:
                try:
                    model(sample[None].to(device), use_cache=False)
                except _Captured:
                    pass
    finally:
        handle.remove()
    return inputs, kwargs_seen


@torch.no_grad()
def run_layer(layer: nn.Module, inputs: list[torch.Tensor], kwargs: dict
              ) -> list[torch.Tensor]:
    """The layer's output for each window, kept where that window's input was."""
    device, outputs = module_device(layer), []
    for hidden in inputs:
        out = layer(hidden.to(device), **kwargs)
        outputs.append((out[0] if isinstance(out, tuple) else out).to(hidden.device))
    return outputs


@torch.no_grad()
def collect_linear_inputs(layer: nn.Module, inputs: list[torch.Tensor], kwargs: dict,
                          on_input: Callable[[str, torch.Tensor], None],
                          names: list[str] | None = None) -> None:
    """Replays ``layer``, calling ``on_input(linear_name, x [T, K])`` for every linear (or
    only those in ``names``: the replay then stops once they have all been seen)."""
    wanted = None if names is None else set(names)
    handles = []

    def hook(name: str, x: torch.Tensor, seen: set) -> None:
        on_input(name, x.reshape(-1, x.shape[-1]))
        seen.add(name)
        if wanted is not None and seen >= wanted:
            raise _Captured  # the rest of the layer is not needed

    for name, module in layer.named_modules():
        if isinstance(module, nn.Linear) and (wanted is None or name in wanted):
            handles.append(module.register_forward_hook(
                lambda _m, args, _out, name=name: hook(name, args[0], seen_now)))
    device = module_device(layer)
    try:
        for hidden in inputs:
            seen_now: set = set()
            try:
                layer(hidden.to(device), **kwargs)
            except _Captured:
                pass
    finally:
        for handle in handles:
            handle.remove()
