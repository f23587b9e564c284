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
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


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
    """``topk_ids`` int [M, top_k] (values in ``[0, num_experts)``) -> ``ExpertBlocks``."""
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
