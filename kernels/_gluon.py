"""Gluon (Triton's explicit-layout dialect, ``triton.experimental.gluon``) for the
W4A16 tensor-core kernels, across the Triton releases tamis meets: the H200 image's 3.6
and PyPI's 3.9, which renamed two builtins (Gluon is experimental). The kernels use the
names below instead of the release's own.

- ``thread_barrier``: a barrier of the program's threads (3.6 ``gl.thread_barrier``,
  3.9 ``gl.barrier``).
- ``async_load``: ``cp.async`` from global to shared memory (3.6
  ``async_copy_global_to_shared``, 3.9 ``async_load``; 3.9 keeps the old name only to
  raise).
- ``tma_load``: a TMA copy of a tensor descriptor's box into shared memory, signalling an
  mbarrier (3.6 ``tma.async_copy_global_to_shared``, 3.9 ``tma.async_load``).
- ``rows_view``: a shared buffer [R, C] stored whole (2-D layout) seen as R rows to
  ``.index`` (a 1-D layout), through 3.6's ``_reinterpret`` or 3.9's ``reinterpret``.
- ``gdc_wait`` / ``gdc_launch_dependents``: programmatic dependent launch, Triton's
  own builtins, which Gluon kernels call as they are (``tamis.kernels.pdl``).

``gluon`` is None where Triton or Gluon is missing (CPU-only installs); then the
kernels are never called (their dispatch checks) and none of the names exist.
"""
from __future__ import annotations

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy
    from triton.experimental.gluon.language.nvidia.hopper import tma
    from tamis.kernels.pdl import gdc_launch_dependents, gdc_wait  # noqa: F401
except ImportError:  # no triton, or one without Gluon
    gluon = None

if gluon is not None:
    thread_barrier = gl.thread_barrier if hasattr(gl, "thread_barrier") else gl.barrier
    async_load = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared
    tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared

    _NEW_REINTERPRET = gl.constexpr(hasattr(gl.shared_memory_descriptor, "reinterpret"))

    @gluon.jit
    def rows_view(buffer):
        """An unswizzled [R, C] shared buffer as R rows of C (``buffer.index(r)``)."""
        ROWS: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[0])
        if _NEW_REINTERPRET:
            view = buffer.reinterpret(buffer.dtype, buffer.shape, ROWS)
        else:
            view = buffer._reinterpret(buffer.dtype, buffer.shape, ROWS)
        return view
