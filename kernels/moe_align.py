"""Sort the (token, expert) pairs of a routed batch by expert, in blocks of ``block_m``.

A grouped GEMM reads one expert's weight per block of ``block_m`` rows, so every expert's
rows start on a block edge and its last block is padded. With ``M`` tokens routed to
``top_k`` experts each, pair ``i`` (``0 <= i < M * top_k``) is token ``i // top_k``'s
``i % top_k``-th choice. For top_k=2, block_m=4, experts of pairs ``[1,0, 1,2, 0,1]``::

    sorted_ids  [1 4 P P | 0 2 5 P | 3 P P P | P ...]     P = M * top_k (padding)
    expert_ids  [0       | 1       | 2       | ...]       one per block
    num_padded  12                                         rows in use (blocks 0..2)

The outputs have a fixed size, ``M * top_k + E * (block_m - 1)`` rows rounded up to a
block, whatever the routing: nothing is read back to the host, so a decode step with
this op can be captured in a CUDA graph. Blocks past ``num_padded`` are unused (their
expert id is clamped to a valid one; the kernel skips them). Experts no token chose take
no block.

On CUDA two Triton launches build it (``align_by_expert_triton``): one program counts the
pairs per expert and lays out the blocks, then one program per chunk of pairs places
each pair at its expert's cursor (an atomic increment). The torch reference takes some
twenty small launches; a decode step of an MoE model runs this once per layer, so at
batch 1 the launches alone cost more than the experts' GEMMs. Within an expert the
Triton order is that of the atomics, not the pairs' order: a GEMM row's result does not
depend on its place in the block, so the layer's output is the same.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from tamis.kernels._triton import kernel, next_power_of_2, use_triton

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = tl = None


@dataclass(frozen=True)
class ExpertBlocks:
    """The output of ``align_by_expert`` (see the module docstring)."""
    sorted_ids: torch.Tensor     # int32 [max_rows]: pair index, or num_pairs for padding
    expert_ids: torch.Tensor     # int32 [max_rows // block_m]
    num_padded: torch.Tensor     # int32 [1]: rows in use, a multiple of block_m
    num_pairs: int               # M * top_k
    block_m: int


def max_padded_rows(num_pairs: int, num_experts: int, block_m: int) -> int:
    worst = num_pairs + num_experts * (block_m - 1)
    return -(-worst // block_m) * block_m


def align_by_expert(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> ExpertBlocks:
    """``topk_ids`` int [M, top_k] (values in ``[0, num_experts)``) -> ``ExpertBlocks``:
    the Triton kernels on CUDA, the torch reference elsewhere."""
    if use_triton(topk_ids):
        return align_by_expert_triton(topk_ids, num_experts, block_m)
    return align_by_expert_ref(topk_ids, num_experts, block_m)


def align_by_expert_ref(topk_ids: torch.Tensor, num_experts: int,
                        block_m: int) -> ExpertBlocks:
    """The reference: a stable sort, each expert's pairs in pair order."""
    device = topk_ids.device
    flat = topk_ids.reshape(-1).long()
    num_pairs = flat.numel()
    counts = torch.zeros(num_experts, dtype=torch.long, device=device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    padded_ends = padded.cumsum(0)
    padded_starts = padded_ends - padded
    order = torch.argsort(flat, stable=True)
    experts_in_order = flat[order]
    first_of_expert = counts.cumsum(0) - counts
    rank_in_expert = torch.arange(num_pairs, device=device) - first_of_expert[experts_in_order]
    rows = max_padded_rows(num_pairs, num_experts, block_m)
    sorted_ids = torch.full((rows,), num_pairs, dtype=torch.int32, device=device)
    sorted_ids[padded_starts[experts_in_order] + rank_in_expert] = order.to(torch.int32)
    block_starts = torch.arange(0, rows, block_m, device=device)
    expert_ids = torch.searchsorted(padded_ends, block_starts, right=True)
    expert_ids.clamp_(max=num_experts - 1)
    return ExpertBlocks(sorted_ids, expert_ids.to(torch.int32),
                        padded_ends[-1:].to(torch.int32), num_pairs, block_m)


_PAIRS_PER_PROGRAM = 1024
_BLOCKS_PER_STEP = 64        # the layout program's step over blocks, fewer past 256 bins:
_COMPARES_PER_STEP = 16384    # blocks x expert bins compared at once


if tl is not None:
    @kernel
    def _layout_kernel(ids_ptr, sorted_ids_ptr, expert_ids_ptr, num_padded_ptr, cursor_ptr,
                       num_pairs, num_experts, num_rows, block_m,
                       E_BINS: tl.constexpr, CHUNK: tl.constexpr, BLOCKS: tl.constexpr):
        # One program. Bin E_BINS - 1 (>= num_experts) collects the chunks' tail lanes.
        counts = tl.zeros([E_BINS], dtype=tl.int32)
        lanes = tl.arange(0, CHUNK)
        for start in range(0, num_pairs, CHUNK):
            ids = tl.load(ids_ptr + start + lanes, mask=start + lanes < num_pairs,
                          other=E_BINS - 1)
            counts += tl.histogram(ids.to(tl.int32), E_BINS)
        experts = tl.arange(0, E_BINS)
        real = experts < num_experts
        padded = tl.where(real, (counts + block_m - 1) // block_m * block_m, 0)
        ends = tl.cumsum(padded, axis=0)
        tl.store(cursor_ptr + experts, ends - padded, mask=real)
        tl.store(num_padded_ptr, tl.sum(padded, axis=0))
        # Block b's expert: how many experts end at or before its first row (clamped).
        for first in range(0, num_rows // block_m, BLOCKS):
            blocks = first + tl.arange(0, BLOCKS)
            done = (ends[None, :] <= (blocks * block_m)[:, None]) & real[None, :]
            expert = tl.minimum(tl.sum(done.to(tl.int32), axis=1), num_experts - 1)
            tl.store(expert_ids_ptr + blocks, expert, mask=blocks < num_rows // block_m)
        for start in range(0, num_rows, CHUNK):
            rows = start + lanes
            tl.store(sorted_ids_ptr + rows, tl.full([CHUNK], 0, tl.int32) + num_pairs,
                     mask=rows < num_rows)

    @kernel
    def _place_kernel(ids_ptr, sorted_ids_ptr, cursor_ptr, num_pairs, CHUNK: tl.constexpr):
        pairs = tl.program_id(0) * CHUNK + tl.arange(0, CHUNK)
        valid = pairs < num_pairs
        ids = tl.load(ids_ptr + pairs, mask=valid, other=0)
        row = tl.atomic_add(cursor_ptr + ids, 1, mask=valid)
        tl.store(sorted_ids_ptr + row, pairs, mask=valid)


def align_by_expert_triton(topk_ids: torch.Tensor, num_experts: int,
                           block_m: int) -> ExpertBlocks:
    """``align_by_expert`` in two Triton launches (see the module docstring)."""
    device = topk_ids.device
    flat = topk_ids.reshape(-1).to(torch.int32).contiguous()
    num_pairs = flat.numel()
    rows = max_padded_rows(num_pairs, num_experts, block_m)
    sorted_ids = torch.empty(rows, dtype=torch.int32, device=device)
    expert_ids = torch.empty(rows // block_m, dtype=torch.int32, device=device)
    num_padded = torch.empty(1, dtype=torch.int32, device=device)
    cursor = torch.empty(num_experts, dtype=torch.int32, device=device)
    bins = next_power_of_2(num_experts + 1)
    _layout_kernel[(1,)](flat, sorted_ids, expert_ids, num_padded, cursor, num_pairs,
                         num_experts, rows, block_m, E_BINS=bins, CHUNK=_PAIRS_PER_PROGRAM,
                         BLOCKS=max(16, min(_BLOCKS_PER_STEP, _COMPARES_PER_STEP // bins)))
    if num_pairs:
        grid = (triton.cdiv(num_pairs, _PAIRS_PER_PROGRAM),)
        _place_kernel[grid](flat, sorted_ids, cursor, num_pairs, CHUNK=_PAIRS_PER_PROGRAM)
    return ExpertBlocks(sorted_ids, expert_ids, num_padded, num_pairs, block_m)
