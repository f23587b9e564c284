"""Quantized checkpoints under TP=2 (two gloo processes): AWQ, GPTQ with act-order and
per-channel FP8 give TP=1's greedy tokens and logprobs; a layout that cannot be split
into whole groups per rank is refused naming the layer."""
from __future__ import annotations

import pytest
import torch

from tamis.quant.quantizer.pipeline import QuantizeOptions, quantize_checkpoint
from tp_helpers import TP_ATOL, greedy, make_engine, max_logprob_gap, run

# K = 128 (o_proj) and 256 (down_proj): 64 and 128 rows per rank, whole groups of 32.
SHAPES = dict(hidden_size=128, intermediate_size=256, head_dim=32)
SAMPLES = [torch.arange(100, 132), torch.arange(200, 232)]
PROMPTS = [list(range(300, 340)), list(range(500, 520))]
FORMATS = {
    "awq": QuantizeOptions("awq", bits=4, group_size=32, rtn=True, rotate=False),
    "gptq_act_order": QuantizeOptions("gptq", bits=4, group_size=32, desc_act=True, sym=False,
                                      rotate=False),
    "fp8": QuantizeOptions("fp8", rtn=True, rotate=False),
}


@pytest.fixture(scope="module")
def source(tiny_checkpoint):
    return tiny_checkpoint("llama", **SHAPES)


def _quantized(source, out, options):
    quantize_checkpoint(source, out, options, False, SAMPLES)
    return out


@pytest.fixture(scope="module", params=sorted(FORMATS))
def runs(request, source, tmp_path_factory):
    path = _quantized(source, tmp_path_factory.mktemp(request.param), FORMATS[request.param])
    outputs = {}
    for size in (1, 2):
        engine = make_engine(path, size)
        try:
            outputs[size] = run(engine, PROMPTS, greedy(8))
        finally:
            engine.shutdown()
    return request.param, outputs[1], outputs[2], engine.runner.model


def test_tp2_tokens_and_logprobs_equal_tp1(runs):
    _, tp1, tp2, _ = runs
    assert [o.outputs[0].token_ids for o in tp2] == [o.outputs[0].token_ids for o in tp1]
    assert max_logprob_gap(tp1, tp2) <= TP_ATOL


def test_act_order_row_layers_keep_their_own_groups(runs):
    name, *_, model = runs
    down = model.model.layers[1].mlp.down_proj
    if name != "gptq_act_order":
        assert down.input_rows is None
        return
    rows = down.input_rows
    assert rows.numel() == 128 and not torch.equal(rows, torch.arange(128))   # scattered over K


def test_a_split_into_partial_groups_is_refused(tiny_checkpoint, tmp_path):
    # down_proj: K = 192 in groups of 64; each rank's 96 rows would hold half a group.
    source = tiny_checkpoint("llama", **{**SHAPES, "intermediate_size": 192})
    path = _quantized(source, tmp_path / "g64", QuantizeOptions("gptq", bits=4, group_size=64,
                                                                rtn=True, rotate=False))
    with pytest.raises(ValueError, match=r"down_proj: tensor parallel size 2 splits the input "
                                         r"size 192 into slices of 96.*whole quantization groups"):
        make_engine(path, 2)
