"""Bit packing of integer weights into int32, in each published layout.

Every function works on plain integer tensors (values already in ``[0, 2**bits)``)
and is exact; the formats differ only in which dim is packed and in the order of the
values inside one int32:

```
GPTQ / compressed-tensors / tamis   value j of a word sits at bits [bits*j, bits*j+bits)
AWQ GEMM (4-bit only)               word holds columns 8c..8c+7 in the order
                                    AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]: nibble i carries
                                    column 8c + AWQ_ORDER[i]
```

Packing pads the packed dim with zeros up to a multiple of ``32 // bits``; unpacking
takes the true length and drops the padding.
"""
from __future__ import annotations

import torch

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
AWQ_REVERSE_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)


def pack_factor(bits: int) -> int:
    if bits not in (2, 4, 8):
        raise ValueError(f"cannot pack {bits}-bit values into int32 (supported: 2, 4, 8)")
    return 32 // bits


def pack_int32(values: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """Packs integers in ``[0, 2**bits)`` along ``dim`` (sequential order) into int32."""
    factor = pack_factor(bits)
    values = values.to(torch.int64).movedim(dim, -1)
    pad = (-values.shape[-1]) % factor
    if pad:
        values = torch.nn.functional.pad(values, (0, pad))
    values = values.reshape(*values.shape[:-1], -1, factor)
    shifts = torch.arange(factor, dtype=torch.int64, device=values.device) * bits
    packed = (values << shifts).sum(dim=-1)
    packed = torch.where(packed >= 2**31, packed - 2**32, packed)  # two's complement
    return packed.to(torch.int32).movedim(-1, dim).contiguous()


def unpack_int32(packed: torch.Tensor, bits: int, dim: int, length: int) -> torch.Tensor:
    """Inverse of ``pack_int32``: int32 -> int32 values in ``[0, 2**bits)``, ``length`` along ``dim``."""
    if packed.dtype != torch.int32:
        raise ValueError(f"packed weights must be int32, got {packed.dtype}")
    factor = pack_factor(bits)
    words = packed.movedim(dim, -1)
    shifts = torch.arange(factor, dtype=torch.int32, device=packed.device) * bits
    values = (words.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)
    values = values.reshape(*words.shape[:-1], -1)
    if values.shape[-1] < length:
        raise ValueError(f"packed tensor holds {values.shape[-1]} values along dim {dim}, "
                         f"expected at least {length}")
    return values[..., :length].movedim(-1, dim).contiguous()


def pack_awq(values: torch.Tensor) -> torch.Tensor:
    """[R, N] 4-bit values -> [R, N/8] int32 in AutoAWQ's GEMM order (N % 8 == 0)."""
    if values.shape[-1] % 8:
        raise ValueError(f"AWQ packs 8 columns per int32: N={values.shape[-1]} is not a multiple of 8")
    order = torch.tensor(AWQ_ORDER, device=values.device)
    grouped = values.reshape(*values.shape[:-1], -1, 8)[..., order]
    return pack_int32(grouped.reshape(values.shape), 4, dim=-1)


def unpack_awq(packed: torch.Tensor) -> torch.Tensor:
    """[R, N/8] int32 in AutoAWQ's GEMM order -> [R, N] 4-bit values (int32)."""
    values = unpack_int32(packed, 4, dim=-1, length=packed.shape[-1] * 8)
    reverse = torch.tensor(AWQ_REVERSE_ORDER, device=packed.device)
    grouped = values.reshape(*values.shape[:-1], -1, 8)[..., reverse]
    return grouped.reshape(values.shape).contiguous()
