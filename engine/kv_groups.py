"""KV-cache groups: which layers share a block table, and which cache tensor each layer uses.

A model whose layers all attend alike (every layer global, or every layer sliding by the
same W) is one group: one block table per request, one cache tensor per layer, as in a
plain paged cache. A hybrid model (Gemma 2 / 3: sliding layers beside global ones) is cut
into groups of one attention kind each, all of the same size ``G`` (vLLM's hybrid KV
cache manager)::

    Gemma 3, 26 layers: 22 sliding (W) + 4 global  ->  G = min(22, 4) = 4
        group 0  global   layers  5 11 17 23           slot 0 1 2 3
        group 1  sliding  layers  0  1  2  3           slot 0 1 2 3
        ...
        group 6  sliding  layers 24 25 (2 padding)     slot 0 1

Every request holds one block table per group. There are ``G`` cache tensors
(``[2, num_blocks, block_size, Hkv, D]`` each); the layer in slot ``j`` of any group reads
and writes tensor ``j``, at the block ids of its group's table. A block id therefore
stands for the same bytes (``G`` layers' worth of one block) whichever group holds it,
and a block is held by one group at a time: when a sliding group releases the blocks
behind its window, any group may take them, so the memory they held really serves other
tokens. Padding slots (a group smaller than ``G``) leave part of their blocks unused.

``G`` is the smallest layer count among the kinds (vLLM's choice): few groups, at the
price of that padding when counts are not multiples of each other.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KVCacheGroup:
    """Layers that attend alike and share one block table; ``layers[j]`` uses tensor ``j``."""
    layers: tuple[int, ...]
    sliding_window: int | None        # None: global attention, every block kept


def kv_cache_groups(sliding_windows: tuple[int | None, ...] | list[int | None],
                    hybrid: bool = True) -> tuple[KVCacheGroup, ...]:
    """The groups of a model whose layer ``i`` attends within ``sliding_windows[i]``
    (None = global). One group when every layer attends alike, or when ``hybrid`` is off
    (then a model mixing kinds keeps every block: its group has no window). Global groups
    come first, then sliding ones by window; layers stay in order inside a kind."""
    layers = tuple(range(len(sliding_windows)))
    kinds: dict[int | None, list[int]] = {}
    for layer, window in enumerate(sliding_windows):
        kinds.setdefault(window, []).append(layer)
    if len(kinds) <= 1:
        return (KVCacheGroup(layers, next(iter(kinds), None)),)
    if not hybrid:
        return (KVCacheGroup(layers, None),)
    size = min(len(members) for members in kinds.values())
    order = sorted(kinds, key=lambda w: (w is not None, w or 0))
    return tuple(KVCacheGroup(tuple(kinds[window][i:i + size]), window)
                 for window in order for i in range(0, len(kinds[window]), size))


def layer_slots(groups: tuple[KVCacheGroup, ...], num_layers: int) -> tuple[tuple[int, int], ...]:
    """``(group, tensor slot)`` of every layer."""
    where: list[tuple[int, int] | None] = [None] * num_layers
    for g, group in enumerate(groups):
        for slot, layer in enumerate(group.layers):
            where[layer] = (g, slot)
    assert None not in where, "every layer belongs to a group"
    return tuple(where)


def num_tensors(groups: tuple[KVCacheGroup, ...]) -> int:
    """Cache tensors the groups need: the size of the largest group."""
    return max(len(group.layers) for group in groups)


def blocks_per_request(group_windows: tuple[int | None, ...], num_tokens: int, block_size: int,
                       max_chunk: int) -> int:
    """The most blocks one request of ``num_tokens`` holds at once, over all groups: a
    global group holds all of its blocks; a sliding group those the next query can see
    (``W - 1`` keys back) and a chunk of ``max_chunk`` new tokens, plus one block for the
    window's start falling inside a block and one for a full block whose last token is
    still in flight (not yet registered, so not yet released)."""
    full = -(-num_tokens // block_size)
    total = 0
    for window in group_windows:
        held = full if window is None else -(-(window - 1 + max_chunk) // block_size) + 2
        total += min(full, held)
    return total


def max_tokens_per_request(group_windows: tuple[int | None, ...], num_blocks: int, block_size: int,
                           max_chunk: int, limit: int) -> int:
    """The longest request (at most ``limit`` tokens) whose blocks fit in ``num_blocks``."""
    low, high = 0, limit
    while low < high:
        mid = (low + high + 1) // 2
        if blocks_per_request(group_windows, mid, block_size, max_chunk) <= num_blocks:
            low = mid
        else:
            high = mid - 1
    return low


__all__ = ["KVCacheGroup", "kv_cache_groups", "layer_slots", "num_tensors",
           "blocks_per_request", "max_tokens_per_request"]
