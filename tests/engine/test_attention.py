"""TorchAttentionBackend against a naive per-sequence softmax attention.

Random q/k/v, random (shuffled) block tables, batches mixing fresh prefills, prefill
chunks over a cached prefix and single-token decodes; GQA and sliding windows.
"""
from __future__ import annotations

import math
import random

import pytest
import torch

from tamis.engine.attention.backends import get_attention_backend
from tamis.engine.attention.metadata import AttentionMetadata
from tamis.engine.attention.torch_backend import TorchAttentionBackend

torch.set_num_threads(1)   # 2 threads stall on OpenMP barriers when the CPUs are shared
HEAD_DIM, NUM_KV_HEADS, BLOCK_SIZE, NUM_BLOCKS = 8, 2, 4, 64


def naive_attention(q, k, v, context_len: int, scale: float, window: int | None):
    """q [Q, Hq, D] at positions context_len..; k/v [S, Hkv, D] for positions 0..S-1."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), k.double()) * scale
    qpos = torch.arange(context_len, context_len + q.shape[0])[:, None]
    kpos = torch.arange(k.shape[0])[None, :]
    visible = kpos <= qpos
    if window is not None:
        visible &= kpos > qpos - window
    scores = scores.masked_fill(~visible, -math.inf)
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v.double()).float()


class Scenario:
    """Sequences with a cached prefix (already in the cache) and new tokens this step."""

    def __init__(self, specs: list[tuple[int, int]], num_heads: int, seed: int, pad: int = 0):
        gen = torch.Generator().manual_seed(seed)
        blocks = list(range(NUM_BLOCKS))
        random.Random(seed).shuffle(blocks)
        self.kv_cache = torch.zeros(2, NUM_BLOCKS, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
        self.specs, self.full_k, self.full_v, self.tables = specs, [], [], []
        q_parts, k_new, v_new, slots = [], [], [], []
        for context_len, q_len in specs:
            total = context_len + q_len
            table = [blocks.pop() for _ in range(-(-total // BLOCK_SIZE))]
            k = torch.randn(total, NUM_KV_HEADS, HEAD_DIM, generator=gen)
            v = torch.randn(total, NUM_KV_HEADS, HEAD_DIM, generator=gen)
            seq_slots = [table[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for p in range(total)]
            for p in range(context_len):           # the cached prefix, written by earlier steps
                blk, off = divmod(seq_slots[p], BLOCK_SIZE)
                self.kv_cache[0, blk, off], self.kv_cache[1, blk, off] = k[p], v[p]
            q_parts.append(torch.randn(q_len, num_heads, HEAD_DIM, generator=gen))
            k_new.append(k[context_len:])
            v_new.append(v[context_len:])
            slots += seq_slots[context_len:]
            self.full_k.append(k)
            self.full_v.append(v)
            self.tables.append(table)
        query_lens = [q_len for _, q_len in specs]
        seq_lens = [c + q for c, q in specs]
        if pad:                                     # padding tokens: slot -1, never stored
            q_parts.append(torch.randn(pad, num_heads, HEAD_DIM, generator=gen))
            k_new.append(torch.full((pad, NUM_KV_HEADS, HEAD_DIM), 1e4))
            v_new.append(torch.full((pad, NUM_KV_HEADS, HEAD_DIM), 1e4))
            slots += [-1] * pad
            query_lens.append(pad)
            seq_lens.append(pad)
            self.tables.append([])
        self.q, self.k, self.v = torch.cat(q_parts), torch.cat(k_new), torch.cat(v_new)
        width = max(len(t) for t in self.tables)
        starts = [0]
        for n in query_lens:
            starts.append(starts[-1] + n)
        self.meta = AttentionMetadata(
            query_start_loc=torch.tensor(starts, dtype=torch.int32),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
            block_tables=torch.tensor([t + [0] * (width - len(t)) for t in self.tables],
                                      dtype=torch.int32),
            slot_mapping=torch.tensor(slots, dtype=torch.int64),
            max_query_len=max(query_lens), max_seq_len=max(seq_lens), block_size=BLOCK_SIZE,
            query_lens_cpu=query_lens, seq_lens_cpu=seq_lens)

    def expected(self, scale: float, window: int | None) -> list[torch.Tensor]:
        out, start = [], 0
        for (context_len, q_len), k, v in zip(self.specs, self.full_k, self.full_v):
            out.append(naive_attention(self.q[start:start + q_len], k, v, context_len, scale, window))
            start += q_len
        return out


MIXES = {
    "decode_only": [(9, 1), (0, 1), (30, 1), (3, 1)],
    "prefill_only": [(0, 13), (0, 1), (0, 7)],
    "mixed": [(0, 11), (17, 1), (6, 9), (0, 1), (25, 1), (12, 5)],
}


@pytest.mark.parametrize("mix", sorted(MIXES))
@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize("num_heads", [2, 4])
def test_backend_matches_naive_attention(mix, window, num_heads):
    scenario = Scenario(MIXES[mix], num_heads, seed=sum(map(ord, mix)) + 10 * num_heads + (window or 0))
    scale = HEAD_DIM ** -0.5
    out = TorchAttentionBackend().forward(scenario.q, scenario.k, scenario.v, scenario.kv_cache,
                                          scenario.meta, scale, window)
    assert out.shape == scenario.q.shape
    torch.testing.assert_close(out, torch.cat(scenario.expected(scale, window)),
                               atol=1e-5, rtol=1e-5)


def test_new_tokens_are_stored_and_padding_is_skipped():
    scenario = Scenario(MIXES["mixed"], 4, seed=3, pad=3)
    before = scenario.kv_cache.clone()
    out = TorchAttentionBackend().forward(scenario.q, scenario.k, scenario.v, scenario.kv_cache,
                                          scenario.meta, 0.3, None)
    real = sum(q for _, q in MIXES["mixed"])
    torch.testing.assert_close(out[:real], torch.cat(scenario.expected(0.3, None)))
    for (context_len, _), k, v, table in zip(scenario.specs, scenario.full_k, scenario.full_v,
                                             scenario.tables):
        for p in range(k.shape[0]):
            blk, off = table[p // BLOCK_SIZE], p % BLOCK_SIZE
            assert torch.equal(scenario.kv_cache[0, blk, off], k[p])
            assert torch.equal(scenario.kv_cache[1, blk, off], v[p])
    written = (scenario.kv_cache != before).any(dim=(3, 4))
    assert written.sum().item() == 2 * real          # keys and values of the real tokens only
    assert not (scenario.kv_cache == 1e4).any()


def test_no_cache_attends_new_tokens_per_sequence():
    scenario = Scenario([(0, 6), (0, 1), (0, 4)], 4, seed=5)
    out = TorchAttentionBackend().forward(scenario.q, scenario.k, scenario.v, None,
                                          scenario.meta, 0.4, 3)
    torch.testing.assert_close(out, torch.cat(scenario.expected(0.4, 3)), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="cached prefix"):
        cached = Scenario([(4, 2)], 4, seed=6)
        TorchAttentionBackend().forward(cached.q, cached.k, cached.v, None, cached.meta, 0.4)


def test_half_precision_cache():
    scenario = Scenario(MIXES["mixed"], 4, seed=7)
    cache = scenario.kv_cache.to(torch.bfloat16)
    out = TorchAttentionBackend().forward(scenario.q.bfloat16(), scenario.k.bfloat16(),
                                          scenario.v.bfloat16(), cache, scenario.meta, 0.35, None)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), torch.cat(scenario.expected(0.35, None)),
                               atol=5e-2, rtol=5e-2)
    # fp32 activations over a bf16 cache: every chunk, fresh ones too, reads the cache
    scenario = Scenario(MIXES["mixed"], 4, seed=8)
    cache = scenario.kv_cache.to(torch.bfloat16)
    out = TorchAttentionBackend().forward(scenario.q, scenario.k, scenario.v, cache,
                                          scenario.meta, 0.35, None)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, torch.cat(scenario.expected(0.35, None)), atol=5e-2, rtol=5e-2)


def test_get_attention_backend():
    assert isinstance(get_attention_backend("torch", "cpu"), TorchAttentionBackend)
    assert isinstance(get_attention_backend("auto", "cpu"), TorchAttentionBackend)
    assert isinstance(get_attention_backend("triton", torch.device("cpu")), TorchAttentionBackend)
    with pytest.raises(ValueError, match="flash"):
        get_attention_backend("flash", "cpu")
