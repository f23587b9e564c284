"""Random paged-attention batches for kernel tests (imported by the test modules)."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PagedCase:
    q: torch.Tensor               # [T, Hq, D]
    kv_cache: torch.Tensor        # [2, num_blocks, block_size, Hkv, D], random everywhere
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_tables: torch.Tensor    # rows padded with block 0, which holds random data
    max_query_len: int


def make_case(context_lens: list[int], query_lens: list[int], *, num_heads=4, num_kv_heads=2,
              head_dim=16, block_size=4, dtype=torch.float32, device="cpu",
              spare_blocks=3) -> PagedCase:
    """Sequences with the given cached-context and query lengths; blocks scattered at random."""
    seq_lens = [c + q for c, q in zip(context_lens, query_lens)]
    blocks_per_seq = [-(-s // block_size) for s in seq_lens]
    num_blocks = sum(blocks_per_seq) + spare_blocks
    order = torch.randperm(num_blocks).tolist()
    width = max(blocks_per_seq + [1])
    tables = torch.zeros(len(seq_lens), width, dtype=torch.int32)
    taken = 0
    for b, n in enumerate(blocks_per_seq):
        tables[b, :n] = torch.tensor(order[taken:taken + n], dtype=torch.int32)
        taken += n
    qsl = torch.zeros(len(seq_lens) + 1, dtype=torch.int32)
    qsl[1:] = torch.tensor(query_lens).cumsum(0)
    cache = torch.randn(2, num_blocks, block_size, num_kv_heads, head_dim, dtype=dtype)
    q = torch.randn(int(qsl[-1]), num_heads, head_dim, dtype=dtype)
    return PagedCase(q.to(device), cache.to(device), qsl.to(device),
                     torch.tensor(seq_lens, dtype=torch.int32, device=device),
                     tables.to(device), max(query_lens + [0]))


def dense_kv(case: PagedCase, b: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequence b's keys and values [seq_len, Hkv, D], gathered by plain indexing."""
    seq_len = int(case.seq_lens[b])
    block_size = case.kv_cache.shape[2]
    rows = [case.kv_cache[:, int(case.block_tables[b, t // block_size]), t % block_size]
            for t in range(seq_len)]
    kv = torch.stack(rows, dim=1)
    return kv[0], kv[1]
