"""The scheduler alone: token budget, chunked prefill, preemption, order, grammar waits."""
from __future__ import annotations

from tamis.engine.kv_cache import KVCacheManager
from tamis.engine.request import Request, RequestStatus
from tamis.engine.sampling_params import SamplingParams
from tamis.engine.scheduler import Scheduler


def _scheduler(num_blocks=64, block_size=4, max_num_seqs=8, budget=32, policy="fcfs", caching=True):
    kv = KVCacheManager(num_blocks, block_size, caching)
    return Scheduler(kv, max_num_seqs, budget, policy)


def _step(scheduler: Scheduler, sample_token: int = 7):
    """One engine step without a model: every request that samples gets ``sample_token``."""
    out = scheduler.schedule()
    scheduler.update_after_step(out)
    for item in out.scheduled:
        if item.samples:
            item.request.append_output_token(sample_token)
    return out


def _req(rid, n_tokens, priority=0, **params) -> Request:
    return Request(rid, list(range(100, 100 + n_tokens)), SamplingParams(**params), priority=priority)


def test_chunked_prefill_then_decode_within_budget():
    s = _scheduler(budget=10)
    a, b = _req("a", 25), _req("b", 3)
    s.add_request(a)
    s.add_request(b)
    out = _step(s)
    assert [(i.request.request_id, i.num_new_tokens, i.start) for i in out.scheduled] == [("a", 10, 0)]
    assert not out.scheduled[0].samples
    out = _step(s)
    assert [(i.request.request_id, i.num_new_tokens) for i in out.scheduled] == [("a", 10)]
    out = _step(s)   # a finishes its prompt (5) and b fits in the rest of the budget
    assert [(i.request.request_id, i.num_new_tokens) for i in out.scheduled] == [("a", 5), ("b", 3)]
    assert all(i.samples for i in out.scheduled)
    out = _step(s)   # both decode one token
    assert [(i.request.request_id, i.num_new_tokens, i.start) for i in out.scheduled] == [
        ("a", 1, 25), ("b", 1, 3)]


def test_max_num_seqs_caps_the_batch():
    s = _scheduler(max_num_seqs=2, budget=100)
    for i in range(4):
        s.add_request(_req(f"r{i}", 5))
    out = _step(s)
    assert [i.request.request_id for i in out.scheduled] == ["r0", "r1"]
    assert len(s.waiting) == 2


def test_preempts_the_latest_request_when_blocks_run_out():
    s = _scheduler(num_blocks=4, block_size=4, budget=100)
    a, b = _req("a", 8), _req("b", 8)    # 2 blocks each: the pool is full after admission
    s.add_request(a)
    s.add_request(b)
    _step(s)
    assert s.kv_cache.num_free_blocks == 0
    out = _step(s)                        # a needs a 3rd block for its 9th token: b goes
    assert out.preempted == [b] and b.status == RequestStatus.PREEMPTED
    assert b.num_computed_tokens == 0 and b.block_ids == [] and b.num_output_tokens == 1
    assert [i.request.request_id for i in out.scheduled] == ["a"]
    assert s.num_preemptions == 1 and s.waiting == [b]


def test_a_request_preempts_itself_when_it_is_last():
    s = _scheduler(num_blocks=2, block_size=4, budget=100)
    a = _req("a", 8)
    s.add_request(a)
    _step(s)                               # 8 tokens fill both blocks; a samples token 9
    out = _step(s)
    assert out.preempted == [a] and out.scheduled == []


def test_priority_order_and_victim():
    s = _scheduler(num_blocks=4, block_size=4, budget=100, policy="priority")
    low, high = _req("low", 8, priority=10), _req("high", 8, priority=-1)
    s.add_request(low)
    s.add_request(high)
    out = _step(s)
    assert [i.request.request_id for i in out.scheduled] == ["high", "low"]
    out = _step(s)
    assert out.preempted == [low]


def test_waiting_for_grammar_is_skipped_until_ready():
    s = _scheduler()
    g, plain = _req("g", 4), _req("plain", 4)
    g.status = RequestStatus.WAITING_FOR_GRAMMAR
    s.add_request(g)
    s.add_request(plain)
    out = _step(s)
    assert [i.request.request_id for i in out.scheduled] == ["plain"]
    g.status = RequestStatus.WAITING
    out = _step(s)
    assert [i.request.request_id for i in out.scheduled] == ["plain", "g"]


def test_siblings_wait_for_the_shared_prompt_then_hit_the_cache():
    s = _scheduler(budget=100)
    params = SamplingParams(n=3)
    children = [Request(f"{i}_p", list(range(100, 113)), params, parent_id="p", index=i) for i in range(3)]
    for child in children:
        s.add_request(child)
    out = _step(s)
    assert [i.request.request_id for i in out.scheduled] == ["0_p"]
    out = _step(s)
    assert {i.request.request_id for i in out.scheduled} == {"0_p", "1_p", "2_p"}
    assert children[1].num_cached_tokens == 12
    assert children[1].block_ids[:3] == children[0].block_ids[:3] == children[2].block_ids[:3]


def test_finish_frees_blocks_and_leaves_queues():
    s = _scheduler()
    a = _req("a", 9)
    s.add_request(a)
    _step(s)
    s.finish_request(a, RequestStatus.FINISHED_ABORTED)
    assert a.is_finished and a.finish_reason == "abort"
    assert not s.has_unfinished_requests() and s.kv_cache.num_free_blocks == 64
