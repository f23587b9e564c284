"""Sharded layers without processes: each rank's layer is built under a one-process
stand-in of its group (no collective runs), and the ranks' parts, combined as the
collectives would combine them, must give the whole layer's output."""
from __future__ import annotations

import pytest
import torch

from tamis.engine.distributed.parallel_state import TPGroup, tensor_parallel
from tamis.engine.distributed.sharding import kv_head_span, split_evenly
from tamis.engine.layers.linear import QKVLinear, RowLinear
from tamis.quant.fp8_block import Fp8BlockConfig
from tamis.quant.gptq import GPTQConfig
from tamis.quant.packing import pack_int32

torch.set_num_threads(1)
RANKS = 2


def _as_rank(rank: int, make):
    """``make()`` built as rank ``rank`` of RANKS."""
    with tensor_parallel(TPGroup(rank, RANKS)):
        return make()


def _load(layer, tensors: dict) -> None:
    """Loads {(parameter, shard id or None): checkpoint tensor} as the model loader does."""
    params = dict(layer.named_parameters())
    for (name, shard), tensor in tensors.items():
        loader = params[name].weight_loader
        loader(params[name], tensor) if shard is None else loader(params[name], tensor, shard)
    layer.quant_method.process_weights_after_loading(layer)


def _row_output(layer, x: torch.Tensor, rank: int) -> torch.Tensor:
    """Rank ``rank``'s partial sum: its slice of ``x`` (or, for act-order, its rows)."""
    if layer.input_rows is not None:
        local = x[:, layer.input_rows]
    else:
        width = x.shape[1] // RANKS
        local = x[:, rank * width:(rank + 1) * width]
    return layer.quant_method.apply(layer, local, None)


def test_sizes_that_do_not_split_are_refused():
    with pytest.raises(ValueError, match=r"num_attention_heads \(4\) is not divisible by the "
                                         r"tensor parallel size 3"):
        split_evenly(4, 0, 3, "num_attention_heads")
    with pytest.raises(ValueError, match="neither a divisor nor a multiple"):
        kv_head_span(2, 0, 3)
    assert [kv_head_span(1, rank, 2).start for rank in range(2)] == [0, 0]   # replicated
    assert [kv_head_span(4, rank, 2).start for rank in range(2)] == [0, 2]


def test_qkv_shards_hold_their_heads_and_replicate_one_kv_head():
    hidden, head_dim, heads, kv_heads = 32, 8, 4, 1
    shards = {("weight", "q"): torch.randn(32, hidden), ("weight", "k"): torch.randn(8, hidden),
              ("weight", "v"): torch.randn(8, hidden)}
    x = torch.randn(5, hidden)
    whole = QKVLinear(hidden, head_dim, heads, kv_heads, prefix="qkv")
    _load(whole, shards)
    q_full, k_full, v_full = whole(x).split([32, 8, 8], dim=-1)
    q_parts = []
    for rank in range(RANKS):
        part = _as_rank(rank, lambda: QKVLinear(hidden, head_dim, heads, kv_heads, prefix="qkv"))
        _load(part, shards)
        assert (part.num_heads, part.num_kv_heads) == (2, 1)
        q, k, v = part(x).split([16, 8, 8], dim=-1)
        q_parts.append(q)
        torch.testing.assert_close(k, k_full)   # the one key/value head on both ranks
        torch.testing.assert_close(v, v_full)
    torch.testing.assert_close(torch.cat(q_parts, dim=-1), q_full)


def _gptq_act_order(k: int, n: int, group: int) -> dict:
    """GPTQ v1 tensors whose groups are scattered over K (act-order)."""
    groups = k // group
    g_idx = (torch.arange(k) // group)[torch.randperm(k)].to(torch.int32)
    codes = torch.randint(0, 16, (k, n))
    zeros = torch.randint(1, 16, (groups, n))
    return {("qweight", None): pack_int32(codes, 4, dim=0),
            ("qzeros", None): pack_int32(zeros - 1, 4, dim=1),
            ("scales", None): torch.rand(groups, n) / 50 + 1e-3, ("g_idx", None): g_idx}


@pytest.mark.parametrize("quantized", [False, True], ids=["dense", "gptq_act_order"])
def test_row_shards_sum_to_the_whole_layer(quantized):
    k, n = 128, 16
    config = GPTQConfig(bits=4, group_size=32, desc_act=True) if quantized else None
    tensors = _gptq_act_order(k, n, 32) if quantized else {("weight", None): torch.randn(n, k)}

    def make():
        return RowLinear(k, n, quant_config=config, prefix="model.layers.0.mlp.down_proj")

    whole = make()
    _load(whole, tensors)
    x = torch.randn(3, k)
    total = 0
    for rank in range(RANKS):
        part = _as_rank(rank, make)
        _load(part, tensors)
        if quantized:   # its own groups' rows, wherever they lie in K
            rows = part.input_rows
            assert rows.numel() == k // RANKS
            assert bool((tensors[("g_idx", None)][rows] // 2 == rank).all())
        total = total + _row_output(part, x, rank)
    torch.testing.assert_close(total, whole(x), atol=1e-5, rtol=0)


def test_block_fp8_cannot_be_split():
    config = Fp8BlockConfig([128, 128])
    with pytest.raises(ValueError, match="o_proj: .* weight_scale_inv in a layout tensor "
                                         "parallelism cannot split"):
        _as_rank(0, lambda: RowLinear(256, 128, quant_config=config,
                                      prefix="model.layers.0.self_attn.o_proj"))
