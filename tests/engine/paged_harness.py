"""A hand-made stand-in for the model runner: paged KV caches + AttentionMetadata.

``PagedBatcher(spec, num_blocks, block_size)`` keeps per-sequence block tables (blocks
handed out in a shuffled order so tables are not contiguous) and, for each step,
builds the flattened batch of the chunks given::

    logits = batcher.run(model, [("a", [5, 6, 7]), ("b", [9])])   # one forward pass
    logits["a"] -> float32 [3, vocab]

Tokens of a sequence continue where its previous chunk stopped (positions and slots).
"""
from __future__ import annotations

import random

import torch

from tamis.engine.attention.metadata import AttentionMetadata, forward_context


class PagedBatcher:

    def __init__(self, spec, num_blocks: int = 64, block_size: int = 4,
                 dtype: torch.dtype = torch.float32, seed: int = 0, device="cpu"):
        self.block_size, self.device = block_size, torch.device(device)
        shape = (2, num_blocks, block_size, spec.num_kv_heads, spec.head_dim)
        self.kv_caches = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(spec.num_layers)]
        self.free_blocks = list(range(num_blocks))
        random.Random(seed).shuffle(self.free_blocks)
        self.block_tables: dict[str, list[int]] = {}
        self.num_tokens: dict[str, int] = {}

    def _slots(self, seq_id: str, count: int) -> tuple[list[int], list[int]]:
        """Positions and slots for the next ``count`` tokens of ``seq_id`` (allocating blocks)."""
        table = self.block_tables.setdefault(seq_id, [])
        start = self.num_tokens.get(seq_id, 0)
        positions = list(range(start, start + count))
        while len(table) * self.block_size < start + count:
            table.append(self.free_blocks.pop())
        slots = [table[p // self.block_size] * self.block_size + p % self.block_size
                 for p in positions]
        self.num_tokens[seq_id] = start + count
        return positions, slots

    def build(self, chunks: list[tuple[str, list[int]]], pad_tokens: int = 0):
        """(input_ids, positions, AttentionMetadata) for one step; ``pad_tokens`` extra
        tokens with slot -1 are appended as a last sequence of their own."""
        ids, positions, slots, query_lens, seq_lens, tables = [], [], [], [], [], []
        for seq_id, tokens in chunks:
            pos, slot = self._slots(seq_id, len(tokens))
            ids += tokens
            positions += pos
            slots += slot
            query_lens.append(len(tokens))
            seq_lens.append(self.num_tokens[seq_id])
            tables.append(self.block_tables[seq_id])
        if pad_tokens:
            ids += [0] * pad_tokens
            positions += list(range(pad_tokens))
            slots += [-1] * pad_tokens
            query_lens.append(pad_tokens)
            seq_lens.append(pad_tokens)
            tables.append([])
        width = max(len(t) for t in tables) or 1
        block_tables = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
        starts = [0]
        for n in query_lens:
            starts.append(starts[-1] + n)
        meta = AttentionMetadata(
            query_start_loc=torch.tensor(starts, dtype=torch.int32),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32), block_tables=block_tables,
            slot_mapping=torch.tensor(slots, dtype=torch.int64), max_query_len=max(query_lens),
            max_seq_len=max(seq_lens), block_size=self.block_size,
            query_lens_cpu=list(query_lens), seq_lens_cpu=list(seq_lens))
        meta.query_start_loc, meta.seq_lens, meta.block_tables, meta.slot_mapping = (
            t.to(self.device) for t in (meta.query_start_loc, meta.seq_lens, meta.block_tables,
                                        meta.slot_mapping))
        return (torch.tensor(ids, device=self.device), torch.tensor(positions, device=self.device),
                meta)

    @torch.no_grad()
    def run(self, model, chunks: list[tuple[str, list[int]]]) -> dict[str, torch.Tensor]:
        """One forward pass over ``chunks``; the logits of every token, per sequence."""
        input_ids, positions, meta = self.build(chunks)
        with forward_context(meta, self.kv_caches):
            logits = model.compute_logits(model(input_ids, positions))
        out, start = {}, 0
        for seq_id, tokens in chunks:
            out[seq_id] = logits[start:start + len(tokens)]
            start += len(tokens)
        return out
