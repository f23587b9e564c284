"""Where `tamis quantize` computes, and where a layer's calibration activations live.

The model stays in host memory. Like llm-compressor's sequential pipeline and AutoAWQ,
the pipeline moves one decoder layer at a time to the compute device, quantizes it there
(replays, Hessians, AWQ scale and clip searches, GPTQ solves, refits) and moves it back;
only the quantized results come home. Peak device memory is then about

```
one decoder layer (fp32)  +  its Hessians and solve scratch (K x K float32 per stage)
                          +  activations: the layer's inputs and outputs, both kept on the
                             device when they fit (``activation_home``), else one
                             calibration window at a time (they live in host memory)
```
"""
from __future__ import annotations

import contextlib

import torch
from torch import nn

DEVICE_CHOICES = ("auto", "cpu", "cuda", "cuda:N")
# Inputs and outputs of a layer stay on the device while they take at most this share of
# the device memory free at the start; the rest is left to the layer, its Hessians and
# the solves' scratch.
ACTIVATION_SHARE = 0.5


def resolve_device(name: str) -> torch.device:
    """``auto`` (CUDA when torch sees a GPU, else the CPU), ``cpu``, ``cuda`` (the current
    CUDA device) or ``cuda:N``. Raises ValueError naming ``--device`` for anything else
    and for a CUDA device this machine does not have."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise ValueError(f"--device {name!r}: choose one of {', '.join(DEVICE_CHOICES)}")
    if device.type == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ValueError(f"--device {name}: torch sees no CUDA device on this machine "
                         f"(torch.cuda.is_available() is False); use --device cpu or auto")
    count = torch.cuda.device_count()
    index = torch.cuda.current_device() if device.index is None else device.index
    if index >= count:
        names = "cuda:0" if count == 1 else f"cuda:0 to cuda:{count - 1}"
        raise ValueError(f"--device {name}: this machine has {count} CUDA "
                         f"device{'s' if count > 1 else ''} ({names})")
    return torch.device("cuda", index)


def activation_home(device: torch.device, nbytes: int, free_bytes: int | None = None
                    ) -> torch.device:
    """Where a layer's inputs and outputs (``nbytes`` each) are kept between replays:
    ``device`` when both fit in ``ACTIVATION_SHARE`` of its free memory (``free_bytes``;
    measured when None), else the host, from which each window is moved over in turn."""
    if device.type == "cpu":
        return device
    if free_bytes is None:
        free_bytes = torch.cuda.mem_get_info(device)[0]
    return device if 2 * nbytes <= ACTIVATION_SHARE * free_bytes else torch.device("cpu")


def module_device(module: nn.Module) -> torch.device:
    """The device of ``module``'s first parameter (the CPU for a module without any)."""
    parameter = next(module.parameters(), None)
    return torch.device("cpu") if parameter is None else parameter.device


@contextlib.contextmanager
def onloaded(modules: list[nn.Module], device: torch.device):
    """``modules`` moved to ``device`` inside the block, back to the host after it (also
    on an error). Parameters are moved in place, so the model's references (tied
    weights included) follow them."""
    for module in modules:
        module.to(device)
    try:
        yield
    finally:
        for module in modules:
            module.to("cpu")
