"""What the W4A16 kernel modules share: the bit layout of a word, the weight shapes the
tensor-core kernels take, and the device checks that pick them.

Every ``tamis.kernels.w4a16*`` module and ``tamis.kernels.wna16_dequant`` imports these
from here (and the split-K buffers from ``tamis.kernels.splitk``); none imports another
kernel module's helpers, so the kernels form no import circle.

Two word layouts hold the same codes (int32 words packed along K, ``P = 32 // bits``
codes a word):

```
canonical    code j of word r is row P*r + j at bits [bits*j, bits*(j+1))
interleaved  4-bit only: code j at bits 4 * (j // 2 + 4 * (j % 2)), AWQ's nibble order
             0, 2, 4, 6, 1, 3, 5, 7 (the tensor-core kernels' layout, ``mma_pack``)
```
"""
from __future__ import annotations

import functools

import torch

from tamis.kernels._gluon import gluon

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs without triton still get the reference
    triton = None


def code_shifts(bits: int, interleaved: bool = False) -> list[int]:
    """Bit offset of code j (row P*r + j) inside word r, for j = 0..P-1."""
    if interleaved:
        if bits != 4:
            raise ValueError("interleaved words hold 4-bit codes")
        return [4 * (j // 2 + 4 * (j % 2)) for j in range(8)]
    return [bits * j for j in range(32 // bits)]


if triton is not None:

    @triton.jit
    def code_shift(j, BITS: tl.constexpr, INTERLEAVED: tl.constexpr):
        """``code_shifts`` for code indices j (a tensor), inside a Triton kernel."""
        if INTERLEAVED:
            return 4 * ((j >> 1) + 4 * (j & 1))
        return j * BITS


def tensor_core_weight_supported(k: int, group_size: int, bits: int) -> bool:
    """A weight the Gluon tensor-core kernels take: Gluon present, 4-bit codes,
    K % 32 == 0, groups of 32-row multiples or one group for all of K."""
    return (gluon is not None and bits == 4 and k % 32 == 0
            and (group_size % 32 == 0 or group_size >= k))


def integer_zero_points(zeros: torch.Tensor) -> bool:
    """Zero points the interleaved kernels unpack exactly: integers in [0, 16]."""
    return bool(((zeros >= 0) & (zeros <= 16) & (zeros == zeros.round())).all())


def step_rows(k: int, group_size: int) -> int:
    """Rows of K per step of the tensor-core kernels: 128, or the group when it is
    shorter (32 or 64; every step lies inside one group)."""
    return 128 if group_size >= k or group_size % 128 == 0 else (
        64 if group_size % 64 == 0 else 32)


def cuda_capability(device: torch.device) -> tuple[int, int]:
    """(major, minor) compute capability of a CUDA device; (0, 0) for any other device."""
    if device.type != "cuda":
        return (0, 0)
    return _capability(device.index)


def hopper_device(device: torch.device) -> bool:
    """Gluon present and a Hopper GPU (``wgmma`` and the TMA are sm_90 only)."""
    return gluon is not None and cuda_capability(device)[0] == 9


@functools.lru_cache(maxsize=None)
def _capability(index: int | None) -> tuple[int, int]:
    return tuple(torch.cuda.get_device_capability(index))
