"""Fused MoE: the sort by expert, routing, and the Triton grouped GEMMs against the reference."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tamis.engine.layers.fused_moe import select_experts
from tamis.kernels.fused_moe import (MoeTiles, default_tiles, fused_experts, fused_experts_ref,
                                     fused_experts_triton)
from tamis.kernels.moe_align import (align_by_expert, align_by_expert_ref,
                                     align_by_expert_triton, max_padded_rows)
from tamis.kernels.moe_routing import select_experts_ref, select_experts_triton

HIDDEN, INTERMEDIATE = 48, 40     # not multiples of the test tiles: edge masks run


def _weights(experts: int, dtype, device="cpu", hidden=HIDDEN, intermediate=INTERMEDIATE):
    w13 = torch.randn(experts, 2 * intermediate, hidden, device=device) / hidden ** 0.5
    w2 = torch.randn(experts, hidden, intermediate, device=device) / intermediate ** 0.5
    return w13.to(dtype), w2.to(dtype)


def _routing(tokens: int, experts: int, top_k: int, only=None, device="cpu"):
    """Random routing; ``only`` restricts the choice to those experts (the rest get no row)."""
    logits = torch.randn(tokens, experts, device=device)
    if only is not None:
        banned = torch.ones(experts, dtype=torch.bool, device=device)
        banned[list(only)] = False
        logits[:, banned] = float("-inf")
    return select_experts(logits, top_k, renormalize=True)


def _naive(x, w13, w2, weights, ids):
    """Token by token, choice by choice: the definition the reference must meet."""
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for weight, expert in zip(weights[t].tolist(), ids[t].tolist()):
            gate, up = (w13[expert].double() @ x[t].double()).chunk(2)
            out[t] += weight * (w2[expert].double() @ (F.silu(gate) * up))
    return out


def test_align_by_expert_matches_the_documented_example():
    blocks = align_by_expert_ref(torch.tensor([[1, 0], [1, 2], [0, 1]]), num_experts=4,
                                 block_m=4)
    pad = 6
    assert blocks.sorted_ids[:12].tolist() == [1, 4, pad, pad, 0, 2, 5, pad, 3, pad, pad, pad]
    assert blocks.expert_ids[:3].tolist() == [0, 1, 2]
    assert blocks.num_padded.tolist() == [12]
    assert blocks.sorted_ids.numel() == max_padded_rows(6, 4, 4) == 20


@pytest.mark.parametrize("align", [align_by_expert_ref, align_by_expert_triton])
@pytest.mark.parametrize("tokens,experts,top_k,block_m", [
    (1, 4, 2, 16), (37, 8, 2, 16), (64, 4, 1, 16), (50, 6, 3, 4), (0, 4, 2, 16),
    (1, 128, 8, 16), (300, 128, 8, 64),      # Qwen3-MoE's routing: decode, a prefill chunk
    (3, 512, 10, 16)])                       # 512 experts: the layout's shorter block step
def test_align_by_expert_places_every_pair_in_its_experts_block(align, tokens, experts, top_k,
                                                                block_m):
    _, ids = _routing(tokens, experts, top_k)
    blocks = align(ids, experts, block_m)
    num_pairs, used = tokens * top_k, blocks.num_padded.item()
    assert used % block_m == 0 and blocks.sorted_ids.numel() % block_m == 0
    rows = blocks.sorted_ids[:used].long()
    real = rows[rows < num_pairs]
    assert sorted(real.tolist()) == list(range(num_pairs))      # each pair exactly once
    assert (blocks.sorted_ids[used:] == num_pairs).all()
    row_experts = blocks.expert_ids.long().repeat_interleave(block_m)[:used]
    flat = ids.reshape(-1).long()
    is_real = rows < num_pairs
    assert torch.equal(flat[rows[is_real]], row_experts[is_real])
    counts = torch.bincount(flat, minlength=experts)
    assert used == int(((counts + block_m - 1) // block_m * block_m).sum())


def test_align_triton_lays_out_the_blocks_as_the_reference():
    """The same blocks, experts and padding; within a block only the order may differ."""
    _, ids = _routing(1000, 16, 4, only=range(11))        # 5 experts get no block
    _assert_same_layout(ids, 16, 16)


def _assert_same_layout(ids, experts: int, block_m: int) -> None:
    """The Triton sort and the reference give the same blocks, block experts and padding;
    only the order of the pairs within a block may differ."""
    got, want = align_by_expert_triton(ids, experts, block_m), align_by_expert_ref(ids, experts,
                                                                                   block_m)
    assert torch.equal(got.expert_ids, want.expert_ids)
    assert torch.equal(got.num_padded, want.num_padded)
    assert torch.equal(got.sorted_ids.view(-1, block_m).sort(dim=1).values,
                       want.sorted_ids.view(-1, block_m).sort(dim=1).values)


@pytest.mark.parametrize("tokens,experts,top_k,renormalize,dtype", [
    (1, 8, 2, True, torch.float32), (37, 128, 8, True, torch.float32),
    (5, 60, 4, False, torch.float16), (33, 6, 6, True, torch.float32),
    (0, 8, 2, True, torch.float32)])
def test_select_experts_triton_matches_the_reference(tokens, experts, top_k, renormalize, dtype):
    logits = (torch.randn(tokens, experts) * 3).to(dtype)
    weights, ids = select_experts_triton(logits, top_k, renormalize)
    expected_weights, expected_ids = select_experts_ref(logits, top_k, renormalize)
    if dtype == torch.float32:          # distinct logits: the same experts in the same order
        assert torch.equal(ids, expected_ids)
    torch.testing.assert_close(weights, expected_weights)
    assert ids.dtype == torch.int32 and weights.dtype == torch.float32


def test_select_experts_triton_picks_a_true_top_k_among_ties():
    """bf16 logits tie often; the picks carry the k largest probabilities, lowest index
    first among equals, and never a padding column or a banned expert twice."""
    logits = torch.randn(64, 128).bfloat16()
    logits[:, 100:] = float("-inf")
    weights, ids = select_experts_triton(logits, 8, renormalize=False)
    probs = torch.softmax(logits.float(), dim=-1)
    torch.testing.assert_close(weights, probs.gather(1, ids.long()))
    torch.testing.assert_close(weights, torch.topk(probs, 8).values)
    assert (ids < 100).all() and all(len(set(row)) == 8 for row in ids.tolist())
    with pytest.raises(ValueError, match="top_k=9"):
        select_experts_triton(torch.randn(2, 8), 9, True)


def test_select_experts_follows_each_models_rule():
    logits = torch.randn(5, 8)
    weights, ids = select_experts(logits, 2, renormalize=True)       # Mixtral
    expected = torch.softmax(logits.gather(1, ids.long()), dim=-1)
    torch.testing.assert_close(weights, expected)
    raw, raw_ids = select_experts(logits, 2, renormalize=False)     # Qwen MoE, norm_topk_prob off
    assert torch.equal(raw_ids, ids)
    torch.testing.assert_close(raw, torch.softmax(logits, -1).gather(1, ids.long()))
    assert ids.dtype == torch.int32 and weights.dtype == torch.float32


def test_reference_matches_the_definition():
    x = torch.randn(9, HIDDEN)
    w13, w2 = _weights(4, torch.float32)
    weights, ids = _routing(9, 4, 2)
    torch.testing.assert_close(fused_experts_ref(x, w13, w2, weights, ids).double(),
                               _naive(x, w13, w2, weights, ids), atol=1e-5, rtol=1e-5)


TILES = MoeTiles(block_m=16, block_n=32, block_k=16)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("tokens,experts,top_k,only,tiles", [
    (1, 4, 2, None, TILES),                        # one token: two experts, all else empty
    (13, 4, 2, None, TILES),
    (16, 4, 1, (2,), TILES),                       # one expert, exactly one full block
    (23, 8, 2, (0, 5), TILES),                     # six experts get no row
    (33, 8, 3, None, MoeTiles(block_m=16, block_n=16, block_k=32, group_m=4)),
    (7, 2, 2, None, MoeTiles(block_m=32, block_n=64, block_k=64)),   # tiles wider than the layer
])
def test_triton_matches_reference(dtype, tokens, experts, top_k, only, tiles):
    x = torch.randn(tokens, HIDDEN).to(dtype)
    w13, w2 = _weights(experts, dtype)
    weights, ids = _routing(tokens, experts, top_k, only)
    got = fused_experts_triton(x, w13, w2, weights, ids, tiles)
    expected = fused_experts_ref(x, w13, w2, weights, ids)
    assert got.dtype == dtype and got.shape == x.shape
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=4e-3, rtol=4e-3)
    torch.testing.assert_close(got, expected, **tol)


def test_no_tokens_and_the_cpu_dispatch():
    w13, w2 = _weights(4, torch.float32)
    weights, ids = _routing(0, 4, 2)
    assert fused_experts_triton(torch.empty(0, HIDDEN), w13, w2, weights, ids).shape == (0, HIDDEN)
    x = torch.randn(3, HIDDEN)
    weights, ids = _routing(3, 4, 2)
    assert torch.equal(fused_experts(x, w13, w2, weights, ids),
                       fused_experts_ref(x, w13, w2, weights, ids))


def test_mismatched_shapes_are_named():
    w13, w2 = _weights(4, torch.float32)
    weights, ids = _routing(3, 4, 2)
    with pytest.raises(ValueError, match="do not fit"):
        fused_experts_ref(torch.randn(3, HIDDEN + 1), w13, w2, weights, ids)
    with pytest.raises(ValueError, match="top_k"):
        fused_experts_ref(torch.randn(4, HIDDEN), w13, w2, weights, ids)


def test_default_tiles_grow_with_the_batch():
    small, large = default_tiles(1, 8), default_tiles(4096, 8)
    assert small.block_m == 16 and large.block_m == 128
    assert large.num_warps >= small.num_warps and large.group_m > small.group_m
    # a decode step of 256 tokens: 64 rows an expert under Mixtral's routing, 16 under Qwen3-MoE's
    assert default_tiles(256, 8, 2).block_m == 64 and default_tiles(256, 128, 8).block_m == 32


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 64, 700])
def test_cuda_bf16_matches_reference_at_mixtral_width(tokens):
    """Compiled kernel, default tiles, bf16, E=8 top-2, H=1024, I=3584 (Mixtral / 4)."""
    x = torch.randn(tokens, 1024, device="cuda").bfloat16()
    w13, w2 = _weights(8, torch.bfloat16, "cuda", hidden=1024, intermediate=3584)
    weights, ids = _routing(tokens, 8, 2, device="cuda")
    got = fused_experts_triton(x, w13, w2, weights, ids)
    expected = fused_experts_ref(x, w13, w2, weights, ids)
    torch.testing.assert_close(got, expected, atol=3e-2, rtol=3e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("tokens,experts,top_k", [(1, 128, 8), (256, 128, 8), (700, 8, 2)])
def test_cuda_routing_and_sort_match_the_references(tokens, experts, top_k):
    """Compiled routing kernel and sort by expert against torch on the same GPU."""
    logits = torch.randn(tokens, experts, device="cuda") * 3
    weights, ids = select_experts_triton(logits, top_k, renormalize=True)
    expected_weights, expected_ids = select_experts_ref(logits, top_k, renormalize=True)
    assert torch.equal(ids, expected_ids)
    torch.testing.assert_close(weights, expected_weights)
    _assert_same_layout(ids, experts, default_tiles(tokens, experts, top_k).block_m)
