"""Tensor and pipeline parallelism over NCCL (two CUDA devices): TP=2 and PP=2 give TP=1's
greedy tokens on a tiny float32 model, with pipelined steps (on by default on CUDA, so
in-flight ids are broadcast over NCCL)."""
from __future__ import annotations

import pytest
import torch

from tp_helpers import greedy, make_engine, max_logprob_gap, run

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")]
PROMPTS = [list(range(300, 340)), list(range(1000, 1013)), [5, 17, 923, 40000, 12]]
GPU_ATOL = 1e-4   # fp32 matmuls and attention on the GPU, summed in another order


def _outputs(path, tp: int, pp: int):
    engine = make_engine(path, tp, pipeline_parallel_size=pp, device="cuda")
    try:
        assert engine.async_scheduling   # in-flight ids: broadcast over NCCL
        return run(engine, PROMPTS, greedy(16))
    finally:
        engine.shutdown()


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("tp,pp", [(2, 1), (1, 2)])
def test_nccl_ranks_give_tp1_tokens(tiny_checkpoint, arch, tp, pp):
    path = tiny_checkpoint(arch)
    want, got = _outputs(path, 1, 1), _outputs(path, tp, pp)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in want]
    assert max_logprob_gap(want, got) <= GPU_ATOL
