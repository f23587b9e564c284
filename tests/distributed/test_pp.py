"""Pipeline parallelism on the CPU (gloo): PP=2 (each stage one of the tiny models' two
layers) and TP=2 x PP=2 give TP=1's greedy tokens and logprobs in float32."""
from __future__ import annotations

import pytest

from tp_helpers import TP_ATOL, greedy, make_engine, max_logprob_gap, run

PROMPTS = [list(range(300, 340)), list(range(1000, 1013)), [5, 17, 923, 40000, 12]]


def _outputs(path, tp: int, pp: int):
    engine = make_engine(path, tp, pipeline_parallel_size=pp)
    try:
        return run(engine, PROMPTS, greedy(8)), engine.runner.model
    finally:
        engine.shutdown()


@pytest.mark.parametrize("arch,tp", [("llama", 1), ("mistral", 1), ("qwen2", 1), ("qwen3", 1),
                                     ("qwen3", 2)])
def test_pipeline_stages_give_tp1_tokens_and_logprobs(tiny_checkpoint, arch, tp):
    path = tiny_checkpoint(arch)
    want, _ = _outputs(path, 1, 1)
    got, model = _outputs(path, tp, 2)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in want]
    assert max_logprob_gap(want, got) <= TP_ATOL
    # Rank 0 is the first stage: the embedding and layer 0; the head is the last stage's.
    assert model.model.embed_tokens is not None and model.lm_head is None
    assert [type(layer).__name__ for layer in model.model.layers][1] == "OtherStageLayer"
