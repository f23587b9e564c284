"""Blocks behind a shared sliding window are released while the request runs: the pool
bookkeeping alone, then a tiny Mistral (window 16) generating 200 tokens through the
engine: few blocks held, the same tokens as transformers and as without dropping, none
leaked."""
from __future__ import annotations

import math

import pytest

from engine_helpers import hf_greedy, make_engine, random_prompts
from tamis.engine.kv_cache import PLACEHOLDER_BLOCK, KVCacheManager
from tamis.engine.loader import kv_cache_spec
from tamis.engine.request import Request
from tamis.engine.sampling_params import SamplingParams
from tamis.engine.scheduler import Scheduler

WINDOW, BLOCK = 16, 16


def _request(tokens, rid="r") -> Request:
    return Request(rid, list(tokens), SamplingParams())


def _compute(manager: KVCacheManager, request: Request, num_tokens: int) -> None:
    """What a scheduled step does to the request's bookkeeping."""
    assert manager.allocate(request, num_tokens - request.num_computed_tokens) is not None
    request.num_computed_tokens = num_tokens
    manager.cache_computed_blocks(request)
    manager.drop_blocks_outside_window(request)


@pytest.mark.parametrize("caching", [True, False])
def test_blocks_wholly_behind_the_window_are_released_front_first(caching):
    manager = KVCacheManager(num_blocks=10, block_size=4, enable_prefix_caching=caching,
                             group_windows=(6,))
    request = _request(range(22))
    _compute(manager, request, 10)
    # next query at 10 sees keys 5..: block 0 (0-3) is behind, block 1 (4-7) is not
    assert request.block_ids[:1] == [PLACEHOLDER_BLOCK] and request.num_dropped_blocks == [1]
    assert manager.num_free_blocks == 10 - 2
    _compute(manager, request, 22)            # keys 17.. : blocks 0-3 behind
    assert request.num_dropped_blocks == [4] and len(request.block_ids) == 6
    assert request.block_ids[:4] == [PLACEHOLDER_BLOCK] * 4
    assert manager.num_free_blocks == 10 - 2
    manager.free(request)
    assert manager.num_free_blocks == 10 and request.num_dropped_blocks == [0]
    assert all(block.ref_cnt == 0 for block in manager.pool.blocks)


def test_unregistered_blocks_are_kept_until_registered():
    """With prefix caching a block leaves only once hashed (its tokens known), so the
    table never loses a block the cache has yet to record."""
    manager = KVCacheManager(num_blocks=10, block_size=4, group_windows=(2,))
    request = _request(range(12))
    manager.allocate(request, 12)
    request.num_computed_tokens = 12
    manager.drop_blocks_outside_window(request)
    assert request.num_dropped_blocks == [0]            # nothing registered yet
    manager.cache_computed_blocks(request)
    manager.drop_blocks_outside_window(request)
    assert request.num_dropped_blocks == [2]


def test_dropped_blocks_keep_their_hash_and_serve_a_later_prefix():
    manager = KVCacheManager(num_blocks=10, block_size=4, group_windows=(4,))
    first = _request(range(20), "a")
    _compute(manager, first, 20)
    kept_ids = [manager.pool.blocks[i] for i in first.block_ids if i != PLACEHOLDER_BLOCK]
    assert first.num_dropped_blocks == [4] and len(kept_ids) == 1
    second = _request(list(range(12)) + [999, 998], "b")
    hits, num_hit = manager.get_computed_blocks(second)
    assert num_hit == 12                              # blocks 0-2, dropped by "a", still valid
    assert manager.allocate(second, second.num_tokens - num_hit, hits) is not None
    manager.free(first)
    manager.free(second)
    assert manager.num_free_blocks == 10


def test_the_scheduler_drops_after_each_step():
    manager = KVCacheManager(num_blocks=64, block_size=4, group_windows=(4,))
    scheduler = Scheduler(manager, max_num_seqs=4, max_num_batched_tokens=64)
    request = _request(range(30))
    scheduler.add_request(request)
    for _ in range(20):
        out = scheduler.schedule()
        scheduler.update_after_step(out)
        for item in out.scheduled:
            if item.samples:
                request.append_output_token(7)
        held = manager.num_held_blocks(request)
        assert held <= math.ceil(4 / 4) + 2, held
    assert request.num_computed_tokens == 30 + 19


def test_each_kind_of_layer_gets_its_group(tiny_checkpoint):
    from transformers import AutoConfig

    def windows(arch, hybrid=True, **overrides):
        config = AutoConfig.from_pretrained(tiny_checkpoint(arch, **overrides))
        return kv_cache_spec(config, hybrid=hybrid).group_windows

    assert windows("mistral", sliding_window=WINDOW) == (WINDOW,)
    assert windows("llama") == (None,)
    assert windows("gemma2") == (None, 16)       # sliding layers alternate with global ones
    assert windows("gemma2", hybrid=False) == (None,)   # every block kept
    with pytest.raises(ValueError, match="sliding_window must be a positive"):
        KVCacheManager(num_blocks=4, block_size=4, group_windows=(0,))


def _generate(engine, prompts, max_tokens: int, check_held: bool):
    """Greedy continuations; with ``check_held``, after every step each running request
    holds at most ceil(W/B) + 2 blocks."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, params)
    finished, bound = {}, math.ceil(WINDOW / BLOCK) + 2
    while engine.has_unfinished_requests():
        finished.update({o.request_id: o for o in engine.step() if o.finished})
        if check_held:
            running = engine.scheduler.running
            for request in running:
                held = engine.kv_cache.num_held_blocks(request)
                assert held <= bound, (request.request_id, request.num_computed_tokens, held)
            in_use = engine.kv_cache.num_blocks - engine.kv_cache.num_free_blocks
            assert in_use <= bound * len(running)
    return [finished[str(i)].outputs[0].token_ids for i in range(len(prompts))]


@pytest.mark.parametrize("caching", [True, False])
def test_mistral_generates_200_tokens_in_a_few_blocks(tiny_checkpoint, caching):
    path = tiny_checkpoint("mistral", sliding_window=WINDOW)
    prompts = random_prompts(lengths=(5, 40), seed=3)
    engine = make_engine(path, block_size=BLOCK, enable_prefix_caching=caching)
    assert engine.kv_cache.group_windows == (WINDOW,)
    dropping = _generate(engine, prompts, 200, check_held=True)
    assert engine.kv_cache.num_free_blocks == engine.kv_cache.num_blocks
    keeping = make_engine(path, block_size=BLOCK, enable_prefix_caching=caching)
    keeping.kv_cache.sliding_groups = ()        # the same engine, every block kept
    assert _generate(keeping, prompts, 200, check_held=False) == dropping
    if caching:
        for prompt, tokens in zip(prompts, dropping):
            assert tokens == hf_greedy(path, prompt, 200)
