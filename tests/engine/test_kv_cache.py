"""Block pool and prefix caching, without a model."""
from __future__ import annotations

from tamis.engine import kv_cache as kv
from tamis.engine.kv_cache import KVCacheManager
from tamis.engine.request import Request
from tamis.engine.sampling_params import SamplingParams


def _request(tokens, rid="r", **params) -> Request:
    return Request(rid, tokens, SamplingParams(**params))


def _admit(manager: KVCacheManager, request: Request) -> list[int]:
    """What the scheduler does: look up, allocate the rest, mark computed and cache."""
    hits, num_hit = manager.get_computed_blocks(request)
    new = manager.allocate(request, request.num_tokens - num_hit, hits)
    assert new is not None
    request.num_computed_tokens = request.num_tokens
    manager.cache_computed_blocks(request)
    return new


def test_allocate_free_and_ref_counts():
    manager = KVCacheManager(num_blocks=8, block_size=4)
    a = _request(list(range(10)))
    assert manager.allocate(a, 10) == [0, 1, 2]
    assert manager.num_free_blocks == 5 and manager.usage == 3 / 8
    a.num_computed_tokens = 10
    assert manager.allocate(a, 2) == []            # 12 tokens still fit in 3 blocks
    assert manager.allocate(a, 3) == [3]
    assert manager.allocate(_request([1] * 40, "big"), 40) is None   # needs 10 > 4 free
    manager.free(a)
    assert manager.num_free_blocks == 8 and a.block_ids == []
    assert all(b.ref_cnt == 0 for b in manager.pool.blocks)


def test_prefix_hit_shares_blocks_and_is_counted_in_full_blocks():
    manager = KVCacheManager(num_blocks=16, block_size=4)
    a = _request(list(range(10)), "a")
    _admit(manager, a)
    b = _request(list(range(9)) + [99, 100], "b")
    hits, num_hit = manager.get_computed_blocks(b)
    assert num_hit == 8 and [h.block_id for h in hits[0]] == a.block_ids[:2]   # group 0
    manager.allocate(b, b.num_tokens - num_hit, hits)
    assert b.block_ids[:2] == a.block_ids[:2] and b.block_ids[2] != a.block_ids[2]
    assert [manager.pool.blocks[i].ref_cnt for i in a.block_ids] == [2, 2, 1]


def test_hit_leaves_at_least_one_token_to_compute():
    manager = KVCacheManager(num_blocks=16, block_size=4)
    _admit(manager, _request(list(range(8)), "a"))
    _, num_hit = manager.get_computed_blocks(_request(list(range(8)), "b"))
    assert num_hit == 4


def test_freed_blocks_stay_hittable_until_reused_and_tail_is_evicted_first():
    manager = KVCacheManager(num_blocks=4, block_size=4)
    a = _request(list(range(12)), "a")
    _admit(manager, a)
    manager.free(a)
    # Free queue: the never-used block first, then a's blocks tail first.
    assert list(manager.pool.free_queue) == [3, 2, 1, 0]
    _, num_hit = manager.get_computed_blocks(_request(list(range(12)) + [5], "b"))
    assert num_hit == 12                                   # still cached after free
    c = _request([7] * 8, "c")                              # takes 2 blocks: 3 then a's tail
    manager.allocate(c, 8)
    assert c.block_ids == [3, 2]
    _, num_hit = manager.get_computed_blocks(_request(list(range(12)) + [5], "d"))
    assert num_hit == 8                                     # the tail block was evicted


def test_hash_collision_is_caught_by_token_verification(monkeypatch):
    monkeypatch.setattr(kv, "hash_block", lambda parent, tokens: 42)   # every block collides
    manager = KVCacheManager(num_blocks=8, block_size=4)
    _admit(manager, _request([1, 2, 3, 4, 5], "a"))
    _, num_hit = manager.get_computed_blocks(_request([9, 9, 9, 9, 5], "b"))
    assert num_hit == 0
    _, num_hit = manager.get_computed_blocks(_request([1, 2, 3, 4, 6], "c"))
    assert num_hit == 4


def test_caching_disabled_never_hits():
    manager = KVCacheManager(num_blocks=8, block_size=4, enable_prefix_caching=False)
    _admit(manager, _request(list(range(9)), "a"))
    assert manager.get_computed_blocks(_request(list(range(9)), "b")) == ([], 0)
    assert manager.pool.cached == {}


def test_revived_blocks_count_against_free_space():
    manager = KVCacheManager(num_blocks=3, block_size=4)
    a = _request(list(range(8)) + [0], "a")
    _admit(manager, a)
    manager.free(a)
    b = _request(list(range(8)) + [1, 2, 3, 4, 5], "b")     # hits 2 freed blocks, needs 2 more
    hits, num_hit = manager.get_computed_blocks(b)
    assert num_hit == 8
    assert manager.allocate(b, b.num_tokens - num_hit, hits) is None
    assert manager.num_free_blocks == 3 and b.block_ids == []


def test_reset_prefix_cache_only_when_idle():
    manager = KVCacheManager(num_blocks=4, block_size=4)
    a = _request(list(range(5)), "a")
    _admit(manager, a)
    assert not manager.reset_prefix_cache()
    manager.free(a)
    assert manager.reset_prefix_cache() and manager.pool.cached == {}
