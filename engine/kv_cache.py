"""Paged KV cache bookkeeping: a block pool with reference counts and prefix caching.

The cache tensors live in the runner; here a block is only an id. A request's block
table is append-only, block ``i`` holding tokens ``i*B .. i*B+B-1``::

    all_token_ids:  [t0 .. t15][t16 .. t31][t32 t33 t34]
    block_ids:      [    7    ][    2     ][    9     ]      B = 16
    block_hashes:   [   h0    ][   h1     ]                  only full blocks are hashed
                    h0 = hash((root, t0..t15)),  h1 = hash((h0, t16..t31))

``root`` is None, or ``hash_salt(cache_salt)`` for a request with a ``cache_salt`` (vLLM's
per-request salt): the whole chain then differs, and since a hit compares parent hashes,
requests share cached blocks only with requests of the same salt.

Prefix caching: a full, computed block is registered under its chain hash. A new request
walks its own chain; a block is a hit when the hash is registered *and* the stored
tokens and parent hash equal the request's (verification against hash collisions).
Freed blocks keep their hash and stay hittable until the pool hands them out again.

Free queue (eviction order, front evicted first): blocks that can never be hit (no
hash) go to the front; a finished request's hashed blocks go to the back tail-first,
so a prefix's tail is evicted before its head. A block with ``ref_cnt > 0`` is never
in the queue.

``allocate`` returns the new block ids or ``None`` when the pool cannot hold the
request; choosing whom to preempt is the scheduler's job.

Sliding window (``sliding_window`` W, set when every attention layer slides by the same
W: ``shared_sliding_window``). The next query of a request is at position
``num_computed_tokens`` or later and sees keys ``> position - W``, so a block whose last
position is ``<= num_computed_tokens - W`` is never read again. ``drop_blocks_outside_window``
releases such blocks (front first) and puts ``PLACEHOLDER_BLOCK`` in their table entries,
so positions keep mapping to table entries::

    block_ids:  [P][P][ 9][ 4]        B = 16, W = 16, num_computed_tokens = 50
                 0  16 32  48         keys 35.. are visible to position 50: block 2 on

A dropped block is released as a finished request's block is: with prefix caching on,
only blocks already registered are dropped, and they keep their hash. Their KV stays
valid (it depends on the tokens up to them, not on the window), so a later request with
the same prefix may still hit them until the pool hands them out again.

Attention gives keys outside the window zero weight: the Triton kernels start at the
tile holding the window's first key, the torch backend masks them. Both may still load a
dropped entry's tile, so the placeholder is an ordinary block (its contents finite: the
cache starts zeroed and only ever holds computed keys); a runner that keeps table rows
between steps may show a dropped block's former id there instead, which is equally unread.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from tamis.engine.request import Request


@dataclass(eq=False)
class KVBlock:
    block_id: int
    ref_cnt: int = 0
    block_hash: int | None = None          # set while registered in the prefix cache
    parent_hash: int | None = None
    token_ids: tuple[int, ...] = ()


# Stands in a block table for a block dropped behind the sliding window (never read).
PLACEHOLDER_BLOCK = 0


def shared_sliding_window(sliding_windows: tuple[int | None, ...] | list[int | None]) -> int | None:
    """The window W when every layer attends within the same W, else None.

    Only then are blocks dropped: all layers share one block table, so a block can go
    only when no layer reads it. Hybrid models (Gemma 2 / 3: sliding layers beside global
    ones) keep every block, since their global layers read the whole sequence; dropping
    per layer kind would need a table per kind (vLLM's hybrid allocator)."""
    windows = set(sliding_windows)
    if len(windows) != 1 or None in windows:
        return None
    return windows.pop()


def hash_block(parent_hash: int | None, token_ids: tuple[int, ...]) -> int:
    return hash((parent_hash, token_ids))


def hash_salt(cache_salt: str | None) -> int | None:
    """The parent hash of a request's first block: None without a salt."""
    return None if cache_salt is None else hash(("cache_salt", cache_salt))


class BlockPool:
    """Owns every block: reference counts, the free queue and the hash -> block map."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"the KV cache needs at least one block, got {num_blocks}")
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        self.free_queue: OrderedDict[int, KVBlock] = OrderedDict(
            (block.block_id, block) for block in self.blocks)
        self.cached: dict[int, KVBlock] = {}

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    def take(self, count: int) -> list[KVBlock]:
        """Pops ``count`` blocks from the front of the free queue (evicting their hashes)."""
        assert count <= len(self.free_queue), "caller must check num_free_blocks"
        taken = []
        for _ in range(count):
            _, block = self.free_queue.popitem(last=False)
            self._uncache(block)
            block.ref_cnt = 1
            taken.append(block)
        return taken

    def touch(self, blocks: list[KVBlock]) -> None:
        """Adds a reference to each (cache-hit) block, taking it out of the free queue."""
        for block in blocks:
            if block.ref_cnt == 0:
                del self.free_queue[block.block_id]
            block.ref_cnt += 1

    def release(self, blocks_in_eviction_order: list[KVBlock]) -> None:
        for block in blocks_in_eviction_order:
            block.ref_cnt -= 1
            assert block.ref_cnt >= 0, f"block {block.block_id} released twice"
            if block.ref_cnt == 0:
                self.free_queue[block.block_id] = block
                if block.block_hash is None:
                    self.free_queue.move_to_end(block.block_id, last=False)

    def lookup(self, block_hash: int, parent_hash: int | None,
               token_ids: tuple[int, ...]) -> KVBlock | None:
        block = self.cached.get(block_hash)
        if block is None or block.parent_hash != parent_hash or block.token_ids != token_ids:
            return None
        return block

    def register(self, block: KVBlock, block_hash: int, parent_hash: int | None,
                 token_ids: tuple[int, ...]) -> None:
        """Makes a computed full block hittable; a duplicate of a registered one stays anonymous."""
        if block.block_hash is not None or block_hash in self.cached:
            return
        block.block_hash, block.parent_hash, block.token_ids = block_hash, parent_hash, token_ids
        self.cached[block_hash] = block

    def _uncache(self, block: KVBlock) -> None:
        if block.block_hash is not None:
            if self.cached.get(block.block_hash) is block:
                del self.cached[block.block_hash]
            block.block_hash, block.parent_hash, block.token_ids = None, None, ()

    def reset_prefix_cache(self) -> bool:
        """Forgets every registered hash; only possible while no block is in use."""
        if self.num_free_blocks != self.num_blocks:
            return False
        for block in self.blocks:
            self._uncache(block)
        return True


class KVCacheManager:
    """Per-request block tables over a ``BlockPool`` (see the module docstring)."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 sliding_window: int | None = None) -> None:
        if sliding_window is not None and sliding_window < 1:
            raise ValueError(f"sliding_window must be a positive token count, got {sliding_window}")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.sliding_window = sliding_window
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

    def get_computed_blocks(self, request: Request) -> tuple[list[KVBlock], int]:
        """The longest verified cached prefix of ``request`` (full blocks only), and its
        token count. At least one token is always left to compute, so the request gets
        logits to sample from. Requests still owing prompt logprobs get no hits (the
        skipped positions would have no logprobs)."""
        if not self.enable_prefix_caching or request.wants_prompt_logprobs:
            return [], 0
        self._update_hashes(request)
        limit = min(len(request.block_hashes), (request.num_tokens - 1) // self.block_size)
        hits: list[KVBlock] = []
        parent = hash_salt(request.cache_salt)
        for i in range(limit):
            tokens = self._block_tokens(request, i)
            block = self.pool.lookup(request.block_hashes[i], parent, tokens)
            if block is None:
                break
            hits.append(block)
            parent = request.block_hashes[i]
        return hits, len(hits) * self.block_size

    def allocate(self, request: Request, num_new_tokens: int,
                 computed_blocks: list[KVBlock] | None = None) -> list[int] | None:
        """Grows ``request.block_ids`` to hold its computed tokens, the ``computed_blocks``
        cache hits (first allocation only) and ``num_new_tokens`` more. Returns the ids of
        the fresh blocks, or ``None`` (nothing changed) when the pool is too small."""
        if not computed_blocks and (request.num_computed_tokens + num_new_tokens
                                    <= len(request.block_ids) * self.block_size):
            return []   # fits in the blocks it holds (most decode steps)
        computed_blocks = computed_blocks or []
        assert not computed_blocks or not request.block_ids, "cache hits only on first allocation"
        num_computed = request.num_computed_tokens + len(computed_blocks) * self.block_size
        total_blocks = self.blocks_needed(num_computed + num_new_tokens)
        num_new_blocks = max(0, total_blocks - len(request.block_ids) - len(computed_blocks))
        num_revived = sum(1 for block in computed_blocks if block.ref_cnt == 0)
        if num_new_blocks + num_revived > self.pool.num_free_blocks:
            return None
        self.pool.touch(computed_blocks)
        new_blocks = self.pool.take(num_new_blocks)
        request.block_ids.extend(block.block_id for block in computed_blocks)
        request.block_ids.extend(block.block_id for block in new_blocks)
        if computed_blocks:
            request.num_registered_blocks = len(computed_blocks)
        return [block.block_id for block in new_blocks]

    def num_cacheable_blocks(self, request: Request) -> int:
        """Full blocks whose tokens are all computed and known on the host (a token in
        flight is computed by the step after the one that sampled it, but its id may not
        have arrived yet)."""
        return min(request.num_computed_tokens, len(request.all_token_ids)) // self.block_size

    def cache_computed_blocks(self, request: Request) -> None:
        """Registers the request's full blocks whose tokens are all computed and known."""
        if not self.enable_prefix_caching:
            return
        num_full = self.num_cacheable_blocks(request)
        start = request.num_registered_blocks
        if num_full <= start:
            return
        self._update_hashes(request)
        for i in range(start, num_full):
            parent = request.block_hashes[i - 1] if i else hash_salt(request.cache_salt)
            self.pool.register(self.pool.blocks[request.block_ids[i]], request.block_hashes[i],
                               parent, self._block_tokens(request, i))
        request.num_registered_blocks = num_full

    def free(self, request: Request) -> None:
        """Drops the request's references, tail first, and clears its block table."""
        held = request.block_ids[request.num_dropped_blocks:]
        self.pool.release([self.pool.blocks[i] for i in reversed(held)])
        request.block_ids = []
        request.num_registered_blocks = 0
        request.num_dropped_blocks = 0

    def drop_blocks_outside_window(self, request: Request) -> None:
        """Releases the request's blocks that no query from ``num_computed_tokens`` on can
        see (see the module docstring); a no-op without a shared sliding window."""
        if self.sliding_window is None:
            return
        first_visible = request.num_computed_tokens - self.sliding_window + 1
        count = min(max(first_visible, 0) // self.block_size, len(request.block_ids))
        if self.enable_prefix_caching:
            count = min(count, request.num_registered_blocks)
        start = request.num_dropped_blocks
        if count <= start:
            return
        dropped = request.block_ids[start:count]
        self.pool.release([self.pool.blocks[i] for i in reversed(dropped)])
        request.block_ids[start:count] = [PLACEHOLDER_BLOCK] * (count - start)
        request.num_dropped_blocks = count

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
           "hash_salt", "shared_sliding_window"]
