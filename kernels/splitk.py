"""Host side of the single-launch split-K reduction the GEMV kernels share.

A split-K GEMV launches ``blocks x splits`` programs. Each program writes its fp32
partial sums to ``partials[split, m, n]`` (a fresh ``torch.empty``), then increments the
counter of its column block; the program that sees ``splits - 1`` sums the partials in
split order (so the result is deterministic), writes the output and puts the counter
back to 0. One launch, no zero-initialised output, no cast kernel afterwards.

Kernels whose tiles set ``last_split_reduces`` sum the same partials in the same order,
but always in the last split (``splits - 1``): the others increment the counter with a
releasing atomic whose result they do not wait for, and it spins on the counter
(acquiring) until they all have, keeps its own partials in registers and loads theirs in
one round. It waits only on earlier blocks of the grid, which wait on nothing. The
W4A16 tensor-core kernels can also store the partials in thread order
(``linear_partials``: a tile's splits side by side, each thread's registers as 16-byte
vectors; ``partial_shape``), the same sums with a quarter of the memory instructions.

The counters live in one int32 buffer per device that stays all-zero between launches.
Kernels on one stream serialize, so every GEMV shares it; GEMVs running at the same time
on two streams of one device would race on it (tamis runs its model on one stream).
"""
from __future__ import annotations

import torch

_COUNTERS: dict[torch.device, torch.Tensor] = {}
_OUTGROWN: list[torch.Tensor] = []  # kept alive: captured CUDA graphs still point at them
_MIN_COUNTERS = 4096


def split_counters(device: torch.device, blocks: int) -> torch.Tensor:
    """An all-zero int32 buffer of at least ``blocks`` counters on ``device``.

    Grows only when a launch needs more column blocks than ever before; an outgrown
    buffer is kept alive, since CUDA graphs captured with it still use it."""
    buf = _COUNTERS.get(device)
    if buf is None or buf.numel() < blocks:
        old = 0 if buf is None else buf.numel()
        if buf is not None:
            _OUTGROWN.append(buf)
        buf = torch.zeros(max(blocks, _MIN_COUNTERS, 2 * old), dtype=torch.int32, device=device)
        _COUNTERS[device] = buf
    return buf


def split_buffers(out: torch.Tensor, splits: int, partial_shape: tuple[int, ...],
                  tiles: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(partials, counters) of a launch with ``splits`` programs per output tile: a fresh
    fp32 [splits, *partial_shape] buffer and the shared counters of ``tiles`` tiles; with
    one split, ``out`` twice (the kernel takes both arguments but touches neither)."""
    if splits == 1:
        return out, out
    partials = torch.empty((splits, *partial_shape), dtype=torch.float32, device=out.device)
    return partials, split_counters(out.device, tiles)


def last_split_constexpr(last_split_reduces: bool, splits: int) -> int:
    """A kernel's LAST_SPLIT_REDUCES constexpr: the split count where the last split sums
    a launch of ``splits`` (> 1) programs along K (its loads unroll over it), else 0."""
    return splits if last_split_reduces and splits > 1 else 0


def linear_partials_constexpr(linear: bool, last_split_reduces: bool, splits: int) -> bool:
    """A kernel's LINEAR_PARTIALS constexpr: the last split sums through partials stored
    in thread order (``w4a16_fragments._reduce_linear_at_last_split``)."""
    return linear and last_split_reduces and splits > 1


def partial_shape(linear: bool, tiles: int, tile_elements: int, m: int, n: int
                  ) -> tuple[int, ...]:
    """The shape of one split's partials after ``split_buffers``' leading split axis: a
    tile's worth per tile in thread order (``linear``), else [M, N]."""
    return (tiles, tile_elements) if linear else (m, n)


def even_split(k: int, block_k: int, splits: int) -> tuple[int, int]:
    """(splits, K per split): each split a whole number of ``block_k`` tiles, none empty."""
    tiles = -(-k // block_k)
    splits = max(1, min(splits, tiles))
    per_split = -(-tiles // splits)
    splits = -(-tiles // per_split)
    return splits, per_split * block_k


def sm_count(tensor: torch.Tensor) -> int:
    """Streaming multiprocessors of ``tensor``'s GPU (4 for CPU tensors: interpreter runs)."""
    if not tensor.is_cuda:
        return 4
    return torch.cuda.get_device_properties(tensor.device).multi_processor_count
