"""The KV block pool: block ids, reference counts, the free queue and the prefix-cache map.

A block here is only an id (the cache tensors live in the runner). A registered block
belongs to one KV-cache group (``tamis.engine.kv_groups``): the cache map is keyed by
``(group, block_hash)``, since two groups holding the same tokens hold different layers'
keys and values, and a hit in one group says nothing of the other.

Free queue (eviction order, front evicted first): blocks that can never be hit (no hash)
go to the front; released hashed blocks go to the back in the order given, so a caller
that releases a prefix tail-first has its tail evicted before its head. A block with
``ref_cnt > 0`` is never in the queue.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass(eq=False)
class KVBlock:
    block_id: int
    ref_cnt: int = 0
    block_hash: int | None = None          # set while registered in the prefix cache
    parent_hash: int | None = None
    token_ids: tuple[int, ...] = ()
    group: int = 0                         # the KV-cache group it is registered for


def hash_block(parent_hash: int | None, token_ids: tuple[int, ...]) -> int:
    return hash((parent_hash, token_ids))


def hash_salt(cache_salt: str | None) -> int | None:
    """The parent hash of a request's first block: None without a salt."""
    return None if cache_salt is None else hash(("cache_salt", cache_salt))


class BlockPool:
    """Owns every block: reference counts, the free queue and the (group, hash) -> block map."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"the KV cache needs at least one block, got {num_blocks}")
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        self.free_queue: OrderedDict[int, KVBlock] = OrderedDict(
            (block.block_id, block) for block in self.blocks)
        self.cached: dict[tuple[int, int], KVBlock] = {}

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

    def lookup(self, group: int, block_hash: int, parent_hash: int | None,
               token_ids: tuple[int, ...]) -> KVBlock | None:
        block = self.cached.get((group, block_hash))
        if block is None or block.parent_hash != parent_hash or block.token_ids != token_ids:
            return None
        return block

    def register(self, group: int, block: KVBlock, block_hash: int, parent_hash: int | None,
                 token_ids: tuple[int, ...]) -> None:
        """Makes a computed full block hittable; a duplicate of a registered one stays anonymous."""
        key = (group, block_hash)
        if block.block_hash is not None or key in self.cached:
            return
        block.block_hash, block.parent_hash, block.token_ids = block_hash, parent_hash, token_ids
        block.group = group
        self.cached[key] = block

    def _uncache(self, block: KVBlock) -> None:
        if block.block_hash is not None:
            key = (block.group, block.block_hash)
            if self.cached.get(key) is block:
                del self.cached[key]
            block.block_hash, block.parent_hash, block.token_ids = None, None, ()

    def reset_prefix_cache(self) -> bool:
        """Forgets every registered hash; only possible while no block is in use."""
        if self.num_free_blocks != self.num_blocks:
            return False
        for block in self.blocks:
            self._uncache(block)
        return True


__all__ = ["BlockPool", "KVBlock", "hash_block", "hash_salt"]
