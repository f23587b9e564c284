"""The rotation an FP8 KV cache with measured scales stores keys and values in.

``random_hadamard(d)`` is ``diag(signs) @ H_d / sqrt(d)``: H_d the Sylvester Hadamard matrix,
signs drawn from a fixed seed. It is orthogonal, so rotating queries and keys alike leaves
every score unchanged (``(q R) . (k R) = q . k``), and rotating values and then the
attention output back leaves the output unchanged (``(P (v R)) R^T = P v``). What it changes
is how each stored vector spreads over its channels: a few large channels become many
middling ones, and e4m3's error, relative to each number, then lands spread over all of
them rather than on the channels the scores depend on most (FlashAttention-3's
"incoherent processing" for FP8 attention; QuaRot's and SpinQuant's online Hadamard on
keys for KV-cache quantization).
"""
from __future__ import annotations

import torch

_SEED = 0


def random_hadamard(dim: int, device: torch.device | str = "cpu",
                    dtype: torch.dtype = torch.float32) -> torch.Tensor | None:
    """[dim, dim] orthogonal randomized Hadamard matrix, the same for the same ``dim``;
    None when ``dim`` is not a power of two (no Sylvester construction)."""
    if dim < 1 or dim & (dim - 1):
        return None
    h = torch.ones(1, 1)
    while h.shape[0] < dim:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)])
    generator = torch.Generator().manual_seed(_SEED)
    signs = torch.randint(0, 2, (dim,), generator=generator).float() * 2 - 1
    return (signs[:, None] * h / dim ** 0.5).to(device=device, dtype=dtype)
