"""Paged KV cache bookkeeping: per-request block tables over one block pool, prefix caching,
and blocks released behind sliding windows.

The cache tensors live in the runner; here a block is only an id (``block_pool.py``). A
model's layers form KV-cache groups (``kv_groups.py``): one for most models, several for
hybrid ones (Gemma 2 / 3: global layers and sliding ones). A request holds one block
table per group, all of the same length, entry ``i`` holding tokens ``i*B .. i*B+B-1``
of the group's layers::

    all_token_ids:  [t0 .. t15][t16 .. t31][t32 t33 t34]
    group 0 global  [    7    ][    2     ][    9     ]      request.block_ids
    group 1 W=16    [    P    ][    5     ][    3     ]      request.group_block_ids[0]
    block_hashes:   [   h0    ][   h1     ]                  only full blocks are hashed
                    h0 = hash((root, t0..t15)),  h1 = hash((h0, t16..t31))

``root`` is None, or ``hash_salt(cache_salt)`` for a request with a ``cache_salt`` (vLLM's
per-request salt): the whole chain then differs, and since a hit compares parent hashes,
requests share cached blocks only with requests of the same salt.

A block id is held by one group of one request at a time (or shared through prefix hits
within one group); its memory is the same for every group, so a block a sliding group
releases can serve any group's tokens next.

Prefix caching: a full, computed block is registered under ``(group, chain hash)``. A hit
of ``k`` blocks must hold the KV every group will read from position ``k*B`` on:

- a global group needs its blocks ``0 .. k-1`` (longest prefix, scanned forward);
- a sliding group (W) only those the query at ``k*B`` can see, blocks
  ``(k*B - W + 1) // B .. k-1``; the earlier entries of its table are placeholders.

``k`` is the largest count meeting both, at most the global groups' prefix (vLLM's
hybrid rule). Each hit is verified: the stored tokens and parent hash must equal the
request's. Freed blocks keep their hash and stay hittable until the pool hands them out.

``allocate`` returns the new block ids or ``None`` when the pool cannot hold the request
(every group grows by the same number of blocks); choosing whom to preempt is the
scheduler's job.

Sliding window W (a sliding group: Mistral's only group, Gemma's sliding ones). The next
query of a request is at position ``num_computed_tokens`` or later and sees keys
``> position - W``, so a block whose last position is ``<= num_computed_tokens - W`` is
never read again. ``drop_blocks_outside_window`` releases such blocks (front first) and
puts ``PLACEHOLDER_BLOCK`` in their table entries, so positions keep mapping to entries::

    block_ids:  [P][P][ 9][ 4]        B = 16, W = 16, num_computed_tokens = 50
                 0  16 32  48         keys 35.. are visible to position 50: block 2 on

A request then holds about ``ceil(L/B)`` blocks per global group and ``W/B + 2`` (plus a
prefill chunk) per sliding group. A dropped block is released as a finished request's
block is: with prefix caching on, only blocks already registered are dropped, and they
keep their hash. Their KV stays valid (it depends on the tokens up to them, not on the
window), so a later request with the same prefix may still hit them until the pool hands
them out again.

Attention gives keys outside the window zero weight: the Triton kernels start at the
tile holding the window's first key, the torch backend masks them. Both may still load a
dropped entry's tile, so the placeholder is an ordinary block (its contents finite: the
cache starts zeroed and only ever holds computed keys); a runner that keeps table rows
between steps may show a dropped block's former id there instead, which is equally unread.
"""
from __future__ import annotations

import itertools

from tamis.engine.block_pool import BlockPool, KVBlock, hash_block, hash_salt
from tamis.engine.request import Request

# Stands in a block table for a block dropped behind the sliding window (never read).
PLACEHOLDER_BLOCK = 0


class KVCacheManager:
    """Per-request block tables, one per KV-cache group, over a ``BlockPool`` (see the
    module docstring). ``group_windows[g]`` is group g's sliding window (None: global);
    the default is one global group."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 group_windows: tuple[int | None, ...] = (None,)) -> None:
        for window in group_windows:
            if window is not None and window < 1:
                raise ValueError(f"sliding_window must be a positive token count, got {window}")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.group_windows = tuple(group_windows)
        self.num_groups = len(self.group_windows)
        self.sliding_groups = tuple(g for g, w in enumerate(self.group_windows) if w is not None)
        self.pool = BlockPool(num_blocks)
        # Counted by the scheduler when a lookup's request is admitted (vLLM's metrics).
        self.prefix_cache_queries = 0                # tokens looked up
        self.prefix_cache_hits = 0                   # of which found in the cache

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def usage(self) -> float:
        """Share of blocks held by requests (0.0 .. 1.0)."""
        return 1.0 - self.pool.num_free_blocks / self.pool.num_blocks

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def tables(self, request: Request) -> list[list[int]]:
        """The request's block table of each group (group 0's is ``request.block_ids``)."""
        if len(request.group_block_ids) != self.num_groups - 1:
            assert not request.block_ids, "a request's groups are set on its first allocation"
            request.group_block_ids = [[] for _ in range(self.num_groups - 1)]
            request.num_dropped_blocks = [0] * self.num_groups
        return [request.block_ids, *request.group_block_ids]

    def num_held_blocks(self, request: Request) -> int:
        """Blocks the request holds over all groups (placeholders excluded)."""
        return sum(len(table) for table in self.tables(request)) - sum(request.num_dropped_blocks)

    # --- prefix caching ------------------------------------------------------------------

    def get_computed_blocks(self, request: Request) -> tuple[list[list[KVBlock | None]], int]:
        """The longest verified cached prefix of ``request`` (full blocks only): per group,
        the hit blocks (None where a sliding group needs none), and the token count. At
        least one token is always left to compute, so the request gets logits to sample
        from. Requests still owing prompt logprobs get no hits (the skipped positions
        would have no logprobs)."""
        if not self.enable_prefix_caching or request.wants_prompt_logprobs:
            return [], 0
        self._update_hashes(request)
        num = min(len(request.block_hashes), (request.num_tokens - 1) // self.block_size)
        found: list[list[KVBlock | None]] = [[] for _ in range(self.num_groups)]
        sliding = self.sliding_groups
        for g in range(self.num_groups):   # global groups: a prefix
            if g not in sliding:
                found[g] = self._lookup(request, g, num, stop_at_miss=True)
                num = len(found[g])
        for g in self.sliding_groups:
            found[g] = self._lookup(request, g, num, stop_at_miss=False)
        while num > 0 and not all(self._window_cached(found[g], num, self.group_windows[g])
                                  for g in self.sliding_groups):
            num -= 1
        if num == 0:
            return [], 0
        hits = []
        for g, window in enumerate(self.group_windows):
            first = self._first_visible_block(num, window) if g in sliding else 0
            hits.append([None] * first + found[g][first:num])
        return hits, num * self.block_size

    def _lookup(self, request: Request, group: int, limit: int,
                stop_at_miss: bool) -> list[KVBlock | None]:
        """The cached block (or None) of each of the request's first ``limit`` blocks in
        ``group``; with ``stop_at_miss``, only those before the first miss."""
        out, parent = [], hash_salt(request.cache_salt)
        for i in range(limit):
            block_hash = request.block_hashes[i]
            block = self.pool.lookup(group, block_hash, parent, self._block_tokens(request, i))
            if block is None and stop_at_miss:
                break
            out.append(block)
            parent = block_hash
        return out

    def _first_visible_block(self, num_blocks: int, window: int) -> int:
        """The first block a query at position ``num_blocks * B`` sees through ``window``."""
        return max(num_blocks * self.block_size - window + 1, 0) // self.block_size

    def _window_cached(self, found: list[KVBlock | None], num_blocks: int, window: int) -> bool:
        first = self._first_visible_block(num_blocks, window)
        return all(block is not None for block in found[first:num_blocks])

    # --- allocation ------------------------------------------------------------------------

    def allocate(self, request: Request, num_new_tokens: int,
                 computed_blocks: list[list[KVBlock | None]] | None = None) -> list[int] | None:
        """Grows the request's block tables to hold its computed tokens, the
        ``computed_blocks`` cache hits (first allocation only, as ``get_computed_blocks``
        returns them) and ``num_new_tokens`` more. Returns the ids of the fresh blocks, or
        ``None`` (nothing changed) when the pool is too small."""
        if not computed_blocks and (request.num_computed_tokens + num_new_tokens
                                    <= len(request.block_ids) * self.block_size):
            return []   # fits in the blocks it holds (most decode steps)
        tables = self.tables(request)
        num_hit = len(computed_blocks[0]) if computed_blocks else 0
        assert not num_hit or not request.block_ids, "cache hits only on first allocation"
        hit_blocks = [b for hits in computed_blocks or () for b in hits if b is not None]
        num_computed = request.num_computed_tokens + num_hit * self.block_size
        total_blocks = self.blocks_needed(num_computed + num_new_tokens)
        num_new_blocks = max(0, total_blocks - len(request.block_ids) - num_hit)
        num_revived = sum(1 for block in hit_blocks if block.ref_cnt == 0)
        if num_new_blocks * self.num_groups + num_revived > self.pool.num_free_blocks:
            return None
        self.pool.touch(hit_blocks)
        new_ids = []
        for g, table in enumerate(tables):
            if num_hit:
                hits = computed_blocks[g]
                table.extend(PLACEHOLDER_BLOCK if b is None else b.block_id for b in hits)
                request.num_dropped_blocks[g] = sum(1 for b in hits if b is None)
            fresh = [block.block_id for block in self.pool.take(num_new_blocks)]
            table.extend(fresh)
            new_ids.extend(fresh)
        if num_hit:
            request.num_registered_blocks = num_hit
        return new_ids

    def num_cacheable_blocks(self, request: Request) -> int:
        """Full blocks whose tokens are all computed and known on the host (a token in
        flight is computed by the step after the one that sampled it, but its id may not
        have arrived yet)."""
        return min(request.num_computed_tokens, len(request.all_token_ids)) // self.block_size

    def cache_computed_blocks(self, request: Request) -> None:
        """Registers the request's full blocks whose tokens are all computed and known,
        in every group."""
        if not self.enable_prefix_caching:
            return
        num_full = self.num_cacheable_blocks(request)
        start = request.num_registered_blocks
        if num_full <= start:
            return
        self._update_hashes(request)
        blocks = self.pool.blocks
        for g, table in enumerate(self.tables(request)):
            assert request.num_dropped_blocks[g] <= start, "only registered blocks are dropped"
            for i in range(start, num_full):
                parent = request.block_hashes[i - 1] if i else hash_salt(request.cache_salt)
                self.pool.register(g, blocks[table[i]], request.block_hashes[i], parent,
                                   self._block_tokens(request, i))
        request.num_registered_blocks = num_full

    def free(self, request: Request) -> None:
        """Drops the request's references, tail first (every group's block at a position
        before the position ahead of it), and clears its block tables."""
        tables = self.tables(request)
        blocks = self.pool.blocks
        columns = [[blocks[i] for i in reversed(table[dropped:])]
                   for table, dropped in zip(tables, request.num_dropped_blocks)]
        if len(columns) == 1:
            held = columns[0]
        else:   # tables end at the same position: interleave them from the tail
            held = [b for row in itertools.zip_longest(*columns) for b in row if b is not None]
        self.pool.release(held)
        request.block_ids = []
        request.group_block_ids = [[] for _ in range(self.num_groups - 1)]
        request.num_registered_blocks = 0
        request.num_dropped_blocks = [0] * self.num_groups

    def drop_blocks_outside_window(self, request: Request) -> None:
        """Releases the blocks of the request's sliding groups that no query from
        ``num_computed_tokens`` on can see (see the module docstring)."""
        tables = None
        for g in self.sliding_groups:
            first_visible = request.num_computed_tokens - self.group_windows[g] + 1
            count = min(max(first_visible, 0) // self.block_size, len(request.block_ids))
            if self.enable_prefix_caching:
                count = min(count, request.num_registered_blocks)
            start = request.num_dropped_blocks[g]
            if count <= start:
                continue
            tables = tables or self.tables(request)
            table = tables[g]
            self.pool.release([self.pool.blocks[i] for i in reversed(table[start:count])])
            table[start:count] = [PLACEHOLDER_BLOCK] * (count - start)
            request.num_dropped_blocks[g] = count

    def reset_prefix_cache(self) -> bool:
        return self.pool.reset_prefix_cache()

    def _block_tokens(self, request: Request, index: int) -> tuple[int, ...]:
        start = index * self.block_size
        return tuple(request.all_token_ids[start:start + self.block_size])

    def _update_hashes(self, request: Request) -> None:
        """Extends ``request.block_hashes`` over every full block of its tokens."""
        num_full = request.num_tokens // self.block_size
        hashes = request.block_hashes
        while len(hashes) < num_full:
            parent = hashes[-1] if hashes else hash_salt(request.cache_salt)
            hashes.append(hash_block(parent, self._block_tokens(request, len(hashes))))


__all__ = ["KVCacheManager", "BlockPool", "KVBlock", "PLACEHOLDER_BLOCK", "hash_block",
           "hash_salt"]
