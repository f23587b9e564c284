"""A step's batch layout built on the host (numpy), for the GPU runner's pinned buffers.

``build_host_batch`` flattens the scheduled chunks (layout in ``attention/metadata.py``),
padded for a decode CUDA graph when asked; ``BlockTableRows`` keeps block-table rows per
request across steps, so a decode step copies only the block ids added since the last.
A hybrid model's KV-cache groups 1.. (``kv_groups.py``) get their own tables and slots.
Pure: plain Python values in, numpy out, tested on CPU.
"""
from __future__ import annotations

import itertools
import operator
from dataclasses import dataclass, field

import numpy as np

from tamis.engine.scheduler import SchedulerOutput


@dataclass
class HostBatch:
    """One step's layout on the host (numpy), padded to ``num_seqs_padded`` sequences.

    ``num_tokens``/``num_seqs`` count the real rows; padding rows follow them."""
    input_ids: np.ndarray        # int64 [T_padded]
    positions: np.ndarray        # int64 [T_padded]
    slot_mapping: np.ndarray     # int64 [T_padded], -1 for padding
    query_start_loc: np.ndarray  # int32 [B_padded + 1]
    seq_lens: np.ndarray         # int32 [B_padded], 0 for padding
    block_tables: np.ndarray     # int32 [B_padded, width], rows padded with 0
    logits_indices: np.ndarray   # int64 [S]
    query_lens: list[int]        # real sequences only
    seq_lens_list: list[int]
    prompt_rows: list[tuple[int, int, int]] = field(default_factory=list)
    num_tokens: int = 0
    num_seqs: int = 0
    # Input rows whose ids come from the previous step's sampled ids on the device
    # (``InflightTokens``): input_ids[inflight_rows[i]] = sampled[inflight_src[i]].
    inflight_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    inflight_src: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    # KV-cache groups 1.. of a hybrid model (kv_groups.py): their block tables and slots,
    # shaped as block_tables and slot_mapping (group 0's).
    group_block_tables: list[np.ndarray] = field(default_factory=list)
    group_slot_mappings: list[np.ndarray] = field(default_factory=list)


class BlockTableRows:
    """Host block-table rows kept per request across steps, so a decode step copies only
    the block ids added since the last one instead of re-reading every table.

    A request's ``block_ids`` only grow until it is preempted (freed, then reallocated
    from scratch with ``num_preemptions`` bumped); a row is rebuilt (zeroed, refilled)
    when that count changes or its last cached id no longer matches. Rows of requests absent from the
    current step are reused, least recently seen first, when all are taken."""

    def __init__(self, num_rows: int, max_blocks: int, group: int = 0):
        self.table = np.zeros((num_rows, max_blocks), dtype=np.int32)
        # The table kept: block_ids (KV-cache group 0) or a hybrid model's group_block_ids.
        self.block_table = _BLOCK_IDS if group == 0 else _group_table(group)
        # id(request) -> [row, ids filled, preemptions, request, last step seen, last id]
        self._entries: dict[int, list] = {}
        self._free = list(range(num_rows - 1, -1, -1))
        self._step = 0

    def rows(self, requests: list) -> np.ndarray:
        """Row index of each request's up-to-date block table in ``self.table``."""
        self._step += 1
        out = []
        step = self._step
        block_table = self.block_table
        for request in requests:
            entry = self._entries.get(id(request))
            ids = block_table(request)
            filled = entry[1] if entry is not None else 0
            if (entry is None or entry[3] is not request
                    or entry[2] != request.num_preemptions or len(ids) < filled
                    or (filled and ids[filled - 1] != entry[5])):
                entry = self._assign(request)
                filled = 0
            if len(ids) > filled:
                self.table[entry[0], filled:len(ids)] = ids[filled:]
                entry[1] = len(ids)
                entry[5] = ids[-1]
            entry[4] = step
            out.append(entry[0])
        return np.asarray(out, dtype=np.int64)

    def _assign(self, request) -> list:
        old = self._entries.pop(id(request), None)
        if old is not None:
            self._free.append(old[0])
        if not self._free:
            stale = sorted((e[4], key) for key, e in self._entries.items() if e[4] < self._step)
            if not stale:
                raise RuntimeError("more requests in one step than block-table rows")
            for _, key in stale[:max(1, len(stale) // 2)]:
                self._free.append(self._entries.pop(key)[0])
        entry = [self._free.pop(), 0, request.num_preemptions, request, self._step, None]
        self.table[entry[0]] = 0   # past a request's blocks its row holds zeros, not a former owner's ids
        self._entries[id(request)] = entry
        return entry


def build_host_batch(batch: SchedulerOutput, block_size: int, pad_to: int | None = None,
                     block_rows: BlockTableRows | None = None,
                     group_rows: list[BlockTableRows] | None = None) -> HostBatch:
    """Flattens the scheduled chunks (layout in ``attention/metadata.py``).

    ``pad_to`` (decode graphs) appends padding sequences of one token each until there
    are ``pad_to`` sequences; it must be >= the number scheduled. ``block_rows`` keeps
    block tables between steps (the GPU runner's); without it they are rebuilt.
    ``group_rows`` (a hybrid model's KV-cache groups 1..: one ``BlockTableRows`` each)
    adds those groups' tables and slots.
    Per-request Python work is a few attribute reads; the rest is numpy over the whole
    batch (a decode step of 256 requests is on the CPU's critical path)."""
    items = batch.scheduled
    num_seqs = len(items)
    total_seqs = num_seqs if pad_to is None else pad_to
    if total_seqs < num_seqs:
        raise ValueError(f"pad_to={pad_to} is smaller than the {num_seqs} scheduled requests")
    # One list per field, read once per request: these comprehensions are the step's
    # per-request Python work; everything after is numpy over the batch.
    requests = [item.request for item in items]
    start_list = [item.start for item in items]
    query_lens = [item.num_new_tokens for item in items]
    starts = np.asarray(start_list, dtype=np.int64)
    qlens = np.asarray(query_lens, dtype=np.int64)
    num_tokens = int(qlens.sum())
    total_tokens = num_tokens + (total_seqs - num_seqs)

    query_start_loc = np.zeros(total_seqs + 1, dtype=np.int32)
    np.cumsum(qlens, out=query_start_loc[1:num_seqs + 1])
    query_start_loc[num_seqs + 1:] = num_tokens + np.arange(1, total_seqs - num_seqs + 1)
    positions = np.zeros(total_tokens, dtype=np.int64)
    input_ids = np.zeros(total_tokens, dtype=np.int64)
    if num_tokens == num_seqs:   # decode: one token each (0 for a token in flight)
        row_of_token = np.arange(num_seqs)
        positions[:num_tokens] = starts
        input_ids[:num_tokens] = [ids[start] if start < len(ids) else 0 for ids, start in
                                  zip(map(_ALL_TOKEN_IDS, requests), start_list)]
    else:
        row_of_token = np.repeat(np.arange(num_seqs), qlens)
        offsets = np.arange(num_tokens) - query_start_loc[:num_seqs][row_of_token]
        positions[:num_tokens] = starts[row_of_token] + offsets
        input_ids[:num_tokens] = np.fromiter(
            itertools.chain.from_iterable(item.token_ids for item in items), dtype=np.int64,
            count=num_tokens)

    block_lists = [request.block_ids for request in requests]
    lens = np.asarray([len(ids) for ids in block_lists], dtype=np.int64)
    width = max(int(lens.max(initial=0)), 1)
    tables = _block_tables(block_lists, lens, width, total_seqs, block_rows, requests)
    pos = positions[:num_tokens]
    slots = _slots(tables, row_of_token, pos, block_size, total_tokens)
    group_tables, group_slots = [], []
    for rows_g in group_rows or ():   # every group's table has group 0's length
        table = _block_tables([rows_g.block_table(r) for r in requests], lens, width,
                              total_seqs, rows_g, requests)
        group_tables.append(table)
        group_slots.append(_slots(table, row_of_token, pos, block_size, total_tokens))
    seq_lens = np.zeros(total_seqs, dtype=np.int32)
    seq_lens[:num_seqs] = starts + qlens

    samples = np.asarray([item.samples for item in items], dtype=bool)
    logits_indices = query_start_loc[1:num_seqs + 1][samples].astype(np.int64) - 1
    prompt_rows = [(i, int(query_start_loc[i]), item.num_prompt_logprob_rows)
                   for i, item in enumerate(items) if item.num_prompt_logprob_rows]
    return HostBatch(input_ids, positions, slots, query_start_loc, seq_lens, tables,
                     logits_indices, query_lens, seq_lens[:num_seqs].tolist(), prompt_rows,
                     num_tokens, num_seqs, group_block_tables=group_tables,
                     group_slot_mappings=group_slots)


def _block_tables(block_lists: list[list[int]], lens: np.ndarray, width: int, total_seqs: int,
                  block_rows: BlockTableRows | None, requests: list) -> np.ndarray:
    """int32 [total_seqs, width]: each request's table, zeros past its blocks and in padding rows."""
    tables = np.zeros((total_seqs, width), dtype=np.int32)
    num_seqs = len(block_lists)
    if block_rows is not None:
        rows = block_rows.rows(requests)
        tables[:num_seqs] = block_rows.table[rows, :width]   # zeros past each request's blocks
    else:
        tables[:num_seqs][np.arange(width) < lens[:, None]] = np.fromiter(
            itertools.chain.from_iterable(block_lists), dtype=np.int32, count=int(lens.sum()))
    return tables


def _slots(tables: np.ndarray, row_of_token: np.ndarray, pos: np.ndarray, block_size: int,
           total_tokens: int) -> np.ndarray:
    """int64 [total_tokens]: each token's cache slot, -1 for padding tokens."""
    slots = np.full(total_tokens, -1, dtype=np.int64)
    slots[:len(pos)] = tables[row_of_token, pos // block_size].astype(np.int64) * block_size \
        + pos % block_size
    return slots


_ALL_TOKEN_IDS = operator.attrgetter("all_token_ids")
_BLOCK_IDS = operator.attrgetter("block_ids")


def _group_table(group: int):
    """Reads the block table of KV-cache group ``group`` (>= 1) of a request."""
    index = group - 1
    return lambda request: request.group_block_ids[index]


__all__ = ["HostBatch", "BlockTableRows", "build_host_batch"]
