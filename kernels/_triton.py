"""Triton plumbing shared by every kernel module: availability, dispatch, dual-mode kernels.

Triton decides at decoration time whether ``@triton.jit`` compiles for the GPU or runs
under the interpreter (``TRITON_INTERPRET=1``). That would make a kernel's mode depend
on which module happened to import it first. ``kernel`` instead keeps the Python
function and builds, on first launch, the variant the tensors need: the compiled
kernel for CUDA tensors, the interpreted one for CPU tensors (CPU tests).

Triton's own library functions (``tl.zeros``, ``tl.sum``, ...) are jitted too, also in
the mode of Triton's import. When Triton was imported for the GPU, an interpreted launch
routes their calls through the interpreter for its duration (``_library_interpreted``).
Helpers a kernel calls are plain ``@triton.jit`` functions: inlined when the kernel
compiles, interpreted with it otherwise (``kernels/moe_tiles.py``).

ROUNDING. Kernels that promise transformers' bf16/fp16 results bit for bit (RMSNorm,
rotary, SiLU-and-mul: each product and sum rounded to the tensor dtype, as eager torch
does) launch with ``enable_fp_fusion=False``. With fusion on, Triton drops the
``.to(bf16).to(float32)`` round trips between a product and the following add and emits
one FMA: measured on the H200, 20% of a rotary's outputs then differ by one ulp from
torch's; with fusion off, 0.
"""
from __future__ import annotations

import contextlib
import functools
import os
import threading
from typing import Any, Callable

import torch


@functools.cache
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def use_triton(tensor: torch.Tensor) -> bool:
    """True when the dispatcher should run the Triton kernel for ``tensor``: a CUDA
    tensor, Triton installed, and ``TAMIS_DISABLE_TRITON`` unset (a debugging switch
    that forces the torch references everywhere)."""
    return (tensor.is_cuda and triton_available()
            and os.environ.get("TAMIS_DISABLE_TRITON", "0") in ("", "0"))


class DualKernel:
    """A Triton kernel launched as ``k[grid](*args, **meta)`` on CUDA or CPU tensors."""

    def __init__(self, fn: Callable[..., Any], unaligned: tuple[str, ...] = ()):
        self.fn = fn
        self.unaligned = unaligned
        self._compiled = None
        self._interpreted = None
        functools.update_wrapper(self, fn)

    def _variant(self, on_cpu: bool):
        if on_cpu:
            if self._interpreted is None:
                from triton.runtime.interpreter import InterpretedFunction
                self._interpreted = InterpretedFunction(self.fn)
            return self._interpreted
        if self._compiled is None:
            from triton.runtime.jit import JITFunction
            try:
                self._compiled = JITFunction(self.fn,
                                             do_not_specialize_on_alignment=list(self.unaligned))
            except TypeError:   # a Triton before the option: alignment variants compile
                self._compiled = JITFunction(self.fn)
        return self._compiled

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
            on_cpu = bool(tensors) and not tensors[0].is_cuda
            if not on_cpu and not _library_built_interpreted():
                return self._variant(False)[grid](*args, **kwargs)
            # CPU tensors; or Triton imported under TRITON_INTERPRET, whose library then
            # cannot be compiled: interpret (CUDA tensors too, copied by the interpreter).
            with _library_interpreted():
                return self._variant(True)[grid](*args, **kwargs)
        return launch


_patch_lock = threading.Lock()


def _library_built_interpreted() -> bool:
    """Triton's library was built for the interpreter: ``TRITON_INTERPRET`` was set when
    Triton was imported. Read from the library itself, not from the variable, which may
    have been set later (a test directory's conftest setting it after another module
    imported Triton for the GPU: the library's functions are then compiled-mode)."""
    from triton.language import standard
    from triton.runtime.interpreter import InterpretedFunction
    return isinstance(standard.zeros, InterpretedFunction)


@contextlib.contextmanager
def _library_interpreted():
    """Runs calls to compiled-mode ``@triton.jit`` functions (Triton's standard library
    when Triton was imported without ``TRITON_INTERPRET``) through the interpreter."""
    if _library_built_interpreted():
        yield
        return
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction
    with _patch_lock:
        original = JITFunction.__call__
        interpreted: dict[int, InterpretedFunction] = {}

        def call(self, *args, **kwargs):
            fn = interpreted.get(id(self))
            if fn is None:
                fn = interpreted[id(self)] = InterpretedFunction(self.fn)
            return fn(*args, **kwargs)

        JITFunction.__call__ = call
        try:
            yield
        finally:
            JITFunction.__call__ = original


def kernel(fn: Callable[..., Any] | None = None, *, unaligned: tuple[str, ...] = ()):
    """Decorator used in place of ``@triton.jit`` (see the module docstring).

    ``unaligned`` names pointer parameters that Triton must not specialize on 16-byte
    alignment. Triton compiles one variant per alignment pattern of its pointer arguments;
    a pointer that is sometimes a view at an odd offset (``seq_lens[decodes:]``) would
    otherwise compile a second variant the first time such a step comes, in the middle of
    serving (half a second on an H100 for the prefill kernel), after every warm-up."""
    if fn is None:
        return lambda f: DualKernel(f, unaligned)
    return DualKernel(fn, unaligned)


def next_power_of_2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())
