"""float32 -> float8 e4m3fn codes with integer ops, rounding to nearest-even as torch's cast does.

Triton's own ``.to(tl.float8e4nv)`` cannot stand in for torch's cast: compiled, some Triton
versions convert through fp16 (two roundings: about 0.1% of codes one step off torch's,
measured on an H100), and the interpreter truncates near binade edges (126.4 -> 64). The
integer encoding is exact in both, so CPU tests and the GPU see the same codes.

A plain ``@triton.jit`` helper: inlined into a compiled kernel, interpreted with an
interpreted one (``tamis.kernels._triton``).
"""
from __future__ import annotations

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: the references only
    triton = tl = None


if tl is not None:
    @triton.jit
    def e4m3_code(x):
        """The e4m3fn bit pattern (int32 in 0..255) of float32 ``x``, which the caller has
        already clamped to [-448, 448] (so no code is NaN)."""
        bits = x.to(tl.int32, bitcast=True)
        mag = bits & 0x7FFFFFFF
        # Normal (|x| >= 2^-6): keep 3 mantissa bits, rebias the exponent 127 -> 7.
        normal = ((mag + 0x7FFFF + ((mag >> 20) & 1)) >> 20) - (120 << 3)
        # Subnormal: a multiple of 2^-9; adding 1.5 * 2^23 rounds to an integer (RNE).
        subnormal = ((tl.abs(x) * 512.0 + 12582912.0) - 12582912.0).to(tl.int32)
        return tl.where(mag < 0x3C800000, subnormal, normal) | ((bits >> 24) & 0x80)
