"""The hybrid KV cache: layers grouped by attention kind, a block table per group, sliding
groups releasing the blocks behind their window.

The grouping and the bookkeeping without a model, then tiny random Gemma 2 (sliding and
global layers alternate) and Gemma 3 (5 sliding : 1 global) through the engine: the same
greedy tokens as transformers with prompts past the 16-token window, few blocks held per
request, more long requests running at once than with every block kept, prefix hits,
preemption and aborts that leak nothing.
"""
from __future__ import annotations

import random

import pytest
import torch
from transformers import AutoConfig

from engine_helpers import hf_greedy, make_engine, random_prompts, run_to_completion
from tamis.engine.kv_cache import PLACEHOLDER_BLOCK, KVCacheManager
from tamis.engine.kv_groups import (blocks_per_request, kv_cache_groups, layer_slots,
                                    max_tokens_per_request, num_tensors)
from tamis.engine.loader import kv_cache_spec
from tamis.engine.request import Request
from tamis.engine.sampling_params import SamplingParams

WINDOW = 16   # the tiny Gemmas' sliding window
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


# ----------------------------------------------------------------- grouping

def test_gemma3_27b_layout_groups_by_the_smaller_kind():
    """52 sliding + 10 global layers: groups of 10, the last sliding one padded."""
    windows = ([1024] * 5 + [None]) * 10 + [1024] * 2
    groups = kv_cache_groups(windows)
    assert [g.sliding_window for g in groups] == [None] + [1024] * 6
    assert [len(g.layers) for g in groups] == [10] * 6 + [2]
    assert groups[0].layers == tuple(range(5, 60, 6))
    assert sorted(layer for g in groups for layer in g.layers) == list(range(62))
    assert num_tensors(groups) == 10
    slots = layer_slots(groups, 62)
    for g, group in enumerate(groups):   # a group's layers use distinct tensors
        assert [slots[layer] for layer in group.layers] == [(g, j) for j in range(len(group.layers))]


def test_uniform_models_are_one_group_and_hybrid_can_be_turned_off():
    assert kv_cache_groups([None] * 4) == kv_cache_groups([None] * 4, hybrid=False)
    assert [g.sliding_window for g in kv_cache_groups([8] * 3)] == [8]
    alternating = kv_cache_groups([16, None] * 3)
    assert [(g.layers, g.sliding_window) for g in alternating] == [((1, 3, 5), None), ((0, 2, 4), 16)]
    assert [g.sliding_window for g in kv_cache_groups([16, None] * 3, hybrid=False)] == [None]


def test_blocks_per_request_and_the_longest_request():
    # global: ceil(100/16) = 7; sliding: W-1 + chunk = 15 + 32 -> 3 blocks, + 2
    assert blocks_per_request((None, 16), 100, 16, 32) == 7 + 5
    assert blocks_per_request((None, 16), 20, 16, 32) == 2 + 2    # never more than the tokens
    longest = max_tokens_per_request((None, 16), 20, 16, 32, limit=10_000)
    assert blocks_per_request((None, 16), longest, 16, 32) <= 20
    assert blocks_per_request((None, 16), longest + 1, 16, 32) > 20
    assert max_tokens_per_request((None,), 20, 16, 32, limit=100) == 100


# ----------------------------------------------------------------- bookkeeping

def _request(tokens, rid="r") -> Request:
    return Request(rid, list(tokens), SamplingParams())


def _compute(manager: KVCacheManager, request: Request, num_tokens: int) -> list[int]:
    """What a scheduled step does to the request's bookkeeping."""
    new = manager.allocate(request, num_tokens - request.num_computed_tokens)
    assert new is not None
    request.num_computed_tokens = num_tokens
    manager.cache_computed_blocks(request)
    manager.drop_blocks_outside_window(request)
    return new


@pytest.mark.parametrize("caching", [True, False])
def test_sliding_group_drops_while_the_global_group_keeps(caching):
    manager = KVCacheManager(num_blocks=40, block_size=4, enable_prefix_caching=caching,
                             group_windows=(None, 8))
    request = _request(range(60))
    for end in range(4, 61, 4):
        _compute(manager, request, end)
        full, sliding = request.block_ids, request.group_block_ids[0]
        assert len(full) == len(sliding) == end // 4
        assert PLACEHOLDER_BLOCK not in full[1:]
        # the next query at `end` sees keys end-7..: blocks (end-7)//4 on
        first = max(end - 7, 0) // 4
        assert request.num_dropped_blocks == [0, first]
        assert sliding[:first] == [PLACEHOLDER_BLOCK] * first
        assert manager.num_held_blocks(request) == 2 * (end // 4) - first
        assert manager.num_free_blocks == 40 - manager.num_held_blocks(request)
    held_sliding = request.group_block_ids[0][request.num_dropped_blocks[1]:]
    assert not set(request.block_ids) & set(held_sliding)   # one owner per block
    manager.free(request)
    assert manager.num_free_blocks == 40
    assert all(block.ref_cnt == 0 for block in manager.pool.blocks)


def test_blocks_a_sliding_group_releases_serve_another_request():
    """The pool is one: without releases a 40-token request needs 20 blocks (10 per
    group); in 16 it runs, holding 12 at the end, and the 4 left, given back by its
    sliding group, hold another request of 8 tokens in both groups."""
    manager = KVCacheManager(num_blocks=16, block_size=4, enable_prefix_caching=False,
                             group_windows=(None, 8))
    a = _request(range(40), "a")
    once_sliding: set[int] = set()
    for end in range(4, 41, 4):
        _compute(manager, a, end)
        once_sliding |= set(a.group_block_ids[0][a.num_dropped_blocks[1]:])
    assert manager.num_held_blocks(a) == 10 + 2
    free_ids = set(manager.pool.free_queue)
    assert len(free_ids) == 4 and free_ids & once_sliding
    b = _request(range(100, 108), "b")
    assert len(_compute(manager, b, 8)) == 4
    assert set(b.block_ids + b.group_block_ids[0]) == free_ids
    assert manager.allocate(_request(range(4), "c"), 4) is None   # none free, 2 needed
    manager.free(a)
    manager.free(b)
    assert manager.num_free_blocks == 16
    keeping = KVCacheManager(num_blocks=16, block_size=4, enable_prefix_caching=False,
                             group_windows=(None, None))
    assert keeping.allocate(_request(range(40)), 40) is None


def test_free_releases_every_groups_tail_first():
    """A finished request's blocks join the free queue position by position from its tail,
    every group's block of a position together, so eviction takes prefixes' tails first."""
    manager = KVCacheManager(num_blocks=40, block_size=4, group_windows=(None, 8))
    request = _request(range(24))
    _compute(manager, request, 24)
    full, sliding = list(request.block_ids), list(request.group_block_ids[0])
    first = request.num_dropped_blocks[1]   # the sliding group's earlier blocks went already
    manager.free(request)
    tail = list(manager.pool.free_queue)[-(len(full) + len(sliding) - first):]
    want = []
    for i in reversed(range(len(full))):
        want += [full[i]] + ([sliding[i]] if i >= first else [])
    assert tail == want


def test_prefix_hit_needs_the_global_prefix_and_the_sliding_window():
    manager = KVCacheManager(num_blocks=64, block_size=4, group_windows=(None, 8))
    a = _request(range(40), "a")
    _compute(manager, a, 40)
    b = _request(list(range(36)) + [999], "b")
    hits, num_hit = manager.get_computed_blocks(b)
    # 9 full blocks; the query at 36 sees keys 29..: sliding blocks 7 and 8 only
    assert num_hit == 36
    assert [h.block_id for h in hits[0]] == a.block_ids[:9]
    assert hits[1][:7] == [None] * 7     # a dropped those, b's window starts later
    assert [(h.group, h.block_hash) for h in hits[1][7:]] == [(1, h) for h in b.block_hashes[7:9]]
    window_block = hits[1][7]
    assert manager.allocate(b, b.num_tokens - num_hit, hits) is not None
    assert b.group_block_ids[0][:7] == [PLACEHOLDER_BLOCK] * 7 and b.num_dropped_blocks == [0, 7]
    assert b.num_registered_blocks == 9
    manager.free(b)
    # The sliding group loses block 7: a hit of 9 or 8 blocks would need it, 7 does not.
    del manager.pool.cached[(1, window_block.block_hash)]
    c = _request(list(range(36)) + [998], "c")
    hits, num_hit = manager.get_computed_blocks(c)
    assert num_hit == 28 and len(hits[0]) == len(hits[1]) == 7
    # A global block missing caps the hit whatever the sliding group holds.
    del manager.pool.cached[(0, manager.pool.blocks[a.block_ids[2]].block_hash)]
    assert manager.get_computed_blocks(_request(list(range(36)) + [997], "d"))[1] == 8
    manager.free(a)
    assert manager.num_free_blocks == 64


# ----------------------------------------------------------------- engine

def _generate(engine, prompts, params, check_held: bool = True):
    """Runs every prompt; after each step, checks each running request holds at most its
    global blocks plus a window's worth per sliding group. Returns (token ids, most
    requests running at once)."""
    kv = engine.kv_cache
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, params)
    finished, most = {}, 0
    chunk = engine.scheduler.max_num_batched_tokens
    while engine.has_unfinished_requests():
        finished.update({o.request_id: o for o in engine.step() if o.finished})
        running = engine.scheduler.running
        most = max(most, len(running))
        for request in running if check_held else ():
            bound = blocks_per_request(kv.group_windows, request.num_computed_tokens + 1,
                                       kv.block_size, chunk)
            assert kv.num_held_blocks(request) <= bound, request
    assert kv.num_free_blocks == kv.num_blocks, "blocks leaked"
    return [finished[str(i)].outputs[0].token_ids for i in range(len(prompts))], most


# name -> (tiny arch, config overrides, KV-cache groups)
HYBRIDS = {"gemma2": ("gemma2", {}, 2), "gemma3": ("gemma3", {}, 6),
           # Qwen2's layers from max_window_layers on slide (here layer 1, window 6)
           "qwen2": ("qwen2", dict(use_sliding_window=True, sliding_window=6, max_window_layers=1), 2)}


@pytest.mark.parametrize("name", sorted(HYBRIDS))
def test_greedy_tokens_equal_transformers_in_a_tiny_pool(tiny_checkpoint, name):
    arch, overrides, num_groups = HYBRIDS[name]
    path = tiny_checkpoint(arch, **overrides)
    prompts = random_prompts(lengths=(40, 90), seed=21)
    engine = make_engine(path, block_size=4, num_gpu_blocks_override=120, max_model_len=112,
                         max_num_batched_tokens=32, max_num_seqs=8)
    kv = engine.kv_cache
    assert kv.num_groups == num_groups and kv.sliding_groups
    got, _ = _generate(engine, prompts, GREEDY)
    for prompt, tokens in zip(prompts, got):
        assert tokens == hf_greedy(path, prompt, GREEDY.max_tokens), len(prompt)


@pytest.mark.parametrize("arch", ["gemma2", "gemma3"])
def test_more_long_requests_run_at_once_than_with_every_block_kept(tiny_checkpoint, arch):
    """At an equal KV-cache memory, releasing sliding blocks lets more 200-token
    requests run together (and the tokens are those of the engine keeping every block)."""
    path = tiny_checkpoint(arch)
    prompts = random_prompts(lengths=(120,) * 5, seed=5)
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    runs = {}
    config = AutoConfig.from_pretrained(path)
    for hybrid in (True, False):
        spec = kv_cache_spec(config, hybrid=hybrid)
        # bytes of 2 requests' 8 blocks over every layer (a hybrid block holds fewer layers)
        num_blocks = 2 * 8 * spec.num_layers // num_tensors(spec.groups)
        engine = make_engine(path, num_gpu_blocks_override=num_blocks, max_model_len=128,
                             max_num_batched_tokens=32, max_num_seqs=8,
                             disable_hybrid_kv_cache_manager=not hybrid)
        assert engine.kv_cache.num_groups == (len(spec.groups) if hybrid else 1)
        runs[hybrid] = _generate(engine, prompts, params, check_held=hybrid)
    (tokens, most), (kept_tokens, kept_most) = runs[True], runs[False]
    assert most > kept_most, (most, kept_most)
    assert tokens == kept_tokens


def test_prefix_hits_and_preemption_keep_the_tokens(tiny_checkpoint):
    """Gemma 3 with a shared 100-token prefix: the second request hits the prefix (its
    sliding groups only the window's blocks); in a pool small enough to preempt, the
    tokens stay those of requests run alone."""
    path = tiny_checkpoint("gemma3")
    rng = random.Random(3)
    prefix = [rng.randrange(100, 49152) for _ in range(100)]
    prompts = [prefix + [rng.randrange(100, 49152) for _ in range(n)] for n in (7, 30, 50)]
    cold = make_engine(path, enable_prefix_caching=False)
    alone = [run_to_completion(cold, [p], GREEDY, prefix=f"alone{i}-")[0].outputs[0].token_ids
             for i, p in enumerate(prompts)]
    warm = make_engine(path, block_size=4)
    run_to_completion(warm, prompts[:1], GREEDY, prefix="a")
    second = run_to_completion(warm, prompts[1:2], GREEDY, prefix="b")[0]
    assert second.num_cached_tokens == 100
    assert second.outputs[0].token_ids == alone[1]
    small = make_engine(path, block_size=4, num_gpu_blocks_override=150, max_model_len=192,
                        max_num_batched_tokens=32, max_num_seqs=8)
    got, _ = _generate(small, prompts, GREEDY)
    assert small.get_stats().num_preemptions > 0
    assert got == alone


def test_aborted_requests_leave_no_block_held(tiny_checkpoint):
    engine = make_engine(tiny_checkpoint("gemma2"), block_size=4, max_num_batched_tokens=32, max_num_seqs=8)
    params = SamplingParams(temperature=0.0, max_tokens=50, ignore_eos=True)
    for i, prompt in enumerate(random_prompts(lengths=(60, 90, 5), seed=8)):
        engine.add_request(str(i), prompt, params)
    for _ in range(6):   # mid-prefill and mid-decode, sliding blocks already dropped
        engine.step()
    assert any(r.num_dropped_blocks[1] for r in engine.scheduler.running)
    engine.abort_request(["0", "1", "2"])
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.kv_cache.num_free_blocks == engine.kv_cache.num_blocks
    assert all(block.ref_cnt == 0 for block in engine.kv_cache.pool.blocks)


def test_gpu_runner_and_triton_kernels_read_each_groups_table(monkeypatch, tiny_checkpoint):
    """The GPU runner's per-group step buffers and the Triton backend (interpreted on
    CPU) give the plain runner's tokens on Gemma 2 past its window."""
    from tamis.engine import engine as engine_module
    from tamis.engine.gpu_runner import GPUModelRunner

    path = tiny_checkpoint("gemma2")
    prompts = random_prompts(lengths=(27, 9), seed=2)
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    args = dict(block_size=4, max_num_batched_tokens=16, enforce_eager=True, max_num_seqs=4)
    want, _ = _generate(make_engine(path, **args), prompts, params)
    monkeypatch.setattr(engine_module, "make_runner", GPUModelRunner)
    engine = make_engine(path, attention_backend="triton", **args)
    monkeypatch.undo()
    assert type(engine.runner).__name__ == "GPUModelRunner" and engine.runner.group_rows
    got, _ = _generate(engine, prompts, params)
    assert got == want


# ----------------------------------------------------------------- GPU

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("arch", ["gemma2", "gemma3"])
def test_cuda_graphs_with_kv_groups_match_eager_and_every_block_kept(tmp_path, arch):
    """On CUDA (Triton kernels, decode graphs over per-group block tables): greedy tokens
    with graphs equal eager ones and those of the engine keeping every block."""
    from tiny_models import make_tiny_checkpoint

    from tamis.engine.llm import LLM

    path = make_tiny_checkpoint(arch, tmp_path / arch, with_tokenizer=False)
    prompts = [[100 + (7 * i + j) % 900 for j in range(20 + 23 * i)] for i in range(9)]
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True, detokenize=False)
    outs = {}
    for eager, hybrid in ((True, True), (False, True), (False, False)):
        llm = LLM(model=str(path), dtype="float32", enforce_eager=eager, max_num_seqs=16,
                  block_size=16, gpu_memory_utilization=0.3, skip_tokenizer_init=True,
                  disable_hybrid_kv_cache_manager=not hybrid)
        runner = llm.llm_engine.runner
        assert bool(runner.graphs) != eager and (runner.num_kv_groups > 1) == hybrid
        outs[eager, hybrid] = [o.outputs[0].token_ids for o in llm.generate(
            [{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)]
        del llm, runner
    assert outs[True, True] == outs[False, True] == outs[False, False]


def test_pipeline_stages_read_their_layers_groups(tiny_checkpoint):
    """PP=2 on the CPU (gloo): each stage holds the cache tensors of its layers' slots and
    receives every group's block tables with the step (Gemma 3: layers 0-2 slide, 3-5
    are three more sliding groups and the global one)."""
    from tamis.engine.engine import LLMEngine

    path = tiny_checkpoint("gemma3")
    prompts = random_prompts(lengths=(45, 12), seed=4)
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    args = dict(model=str(path), dtype="float32", kv_cache_memory_bytes="8MiB", block_size=4,
                max_model_len=128, max_num_seqs=4, max_num_batched_tokens=32, device="cpu")
    want, _ = _generate(LLMEngine(**args), prompts, params)
    engine = LLMEngine(pipeline_parallel_size=2, **args)
    try:
        assert engine.kv_cache.num_groups == 6
        got, _ = _generate(engine, prompts, params)
    finally:
        engine.runner.shutdown()
    assert got == want
