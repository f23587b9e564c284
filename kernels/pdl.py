"""Programmatic dependent launch (PDL) for the decode GEMMs, on Hopper and later.

A decode step is a chain of short kernels (norm, GEMM, rotary, attention, GEMM, ...),
each of a few microseconds, where launching a grid, the first round trip to DRAM and
the split-K epilogue are a large part of the time. Launched with PDL
(``launch_pdl=True``), a kernel may start while the one before it in the stream is
still running. It then must not read what that kernel writes, nor write what it may
still read, before ``gdc_wait()`` (PTX ``griddepcontrol.wait``: the grid before has
completed and its writes are visible). What comes before the wait in our kernels reads
only the layer's weights, scales and zero points, which no kernel of the step writes.

The short kernels that come before the GEMMs in a decoder layer (RMSNorm, SiLU-and-mul,
the decode attention's merge) are launched as before, and only trigger as they start
(``lets_next_launch``): the GEMM after them then loads its weights while they run.

Contract of a kernel launched with ``launch(device)`` true:
- before ``gdc_wait()``: loads of weights and quantization parameters only;
- x, the output, split-K partials and counters: only after it;
- ``gdc_launch_dependents()`` (the next grid may be scheduled once every program of
  this one has passed it) where ``trigger()`` says.

``TAMIS_DISABLE_PDL=1`` turns it off (a debugging switch); ``set_mode`` lets a
benchmark compare the modes in one process.
"""
from __future__ import annotations

import functools
import os

import torch

try:  # Triton's builtins (triton >= 3.3); without them PDL stays off
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:
    gdc_launch_dependents = gdc_wait = None

# When the next kernel may be scheduled: "early" (each program triggers as it starts:
# the next GEMM's weight loads overlap this one's whole run) or "late" (after the main
# loop: they overlap the epilogue); "exit" launches with PDL but leaves the trigger
# implicit, at each program's exit; "off" launches as before. "auto" (the default) is
# "early" for launches of one row of x and "exit" for more: on the H200 early triggers
# gained 0.4-0.9 us per GEMM at one row and cost up to 9 us at 16-32 rows, where the next
# kernel's early programs slowed the running one.
MODES = ("off", "exit", "late", "early", "auto")
_mode = "off" if os.environ.get("TAMIS_DISABLE_PDL", "0") not in ("", "0") else "auto"


def set_mode(mode: str) -> None:
    """Choose one of ``MODES`` for the launches that follow (compiled variants are
    cached per mode)."""
    global _mode
    if mode not in MODES:
        raise ValueError(f"PDL mode must be one of {MODES}; got {mode!r}")
    _mode = mode


def mode() -> str:
    return _mode


def launch(device: torch.device) -> bool:
    """Whether kernels on ``device`` launch with PDL: a CUDA GPU of compute capability
    9.0 or later, Triton's PDL builtins, and a mode other than "off"."""
    return (_mode != "off" and gdc_wait is not None and device.type == "cuda"
            and _capability_major(device.index) >= 9)


def trigger(device: torch.device, rows: int = 1) -> int:
    """The kernels' ``PDL_TRIGGER`` constexpr for a launch on ``rows`` rows of x: 0 none
    (the implicit one at exit), 1 at the start of each program, 2 after its main loop."""
    if not launch(device):
        return 0
    mode = ("early" if rows == 1 else "exit") if _mode == "auto" else _mode
    return {"exit": 0, "early": 1, "late": 2}[mode]


def lets_next_launch(device: torch.device, rows: int = 1) -> bool:
    """The ``PDL_TRIGGER`` flag of the short kernels before the GEMMs (RMSNorm,
    SiLU-and-mul, the decode attention's merge), which are not themselves launched with
    PDL: whether they trigger as they start, so that the GEMM after them starts loading
    its weights while they run (modes "late" and "early", and "auto" for one row: at 64
    rows the AWQ decode on an H200 ran 3% slower with it, within noise)."""
    return launch(device) and (_mode in ("late", "early") or (_mode == "auto" and rows == 1))


@functools.lru_cache(maxsize=None)
def _capability_major(index: int | None) -> int:
    return torch.cuda.get_device_capability(index)[0]
