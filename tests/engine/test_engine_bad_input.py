"""Bad input is refused with a clear ValueError, and the engine keeps serving."""
from __future__ import annotations

import json
import shutil

import pytest

from engine_helpers import make_engine, run_to_completion
from tamis.engine.sampling_params import SamplingParams

PARAMS = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)


@pytest.fixture(scope="module")
def engine(tiny_checkpoint):
    return make_engine(tiny_checkpoint("llama"), max_model_len=64)


@pytest.mark.parametrize("prompt, params, message", [
    ([], PARAMS, "prompt is empty"),
    ("", PARAMS, "prompt is empty"),
    (list(range(100, 165)), PARAMS, "longer than the maximum model length of 64"),
    ([5, 49152], PARAMS, "token id 49152 is out of vocabulary"),
    ([5, -1], PARAMS, "token id -1 is out of vocabulary"),
    ([5, 6], SamplingParams(logit_bias={60000: 1.0}), "logit_bias holds token id 60000"),
    ([5, 6], SamplingParams(allowed_token_ids=[1, 99999]), "allowed_token_ids holds token id 99999"),
    ([5, 6], SamplingParams(logprobs=21), "max_logprobs"),
    ([5, 6], "not params", "params must be SamplingParams"),
    (3.5, PARAMS, "prompt must be a string or a list of token ids"),
])
def test_bad_request_raises_and_engine_still_serves(engine, prompt, params, message):
    with pytest.raises(ValueError, match=message):
        engine.add_request("bad", prompt, params)
    assert not engine.has_unfinished_requests()
    out = run_to_completion(engine, [[7, 8, 9]], PARAMS, prefix="ok")[0]
    assert len(out.outputs[0].token_ids) == 4


def test_duplicate_id_and_interleaved_failure(engine):
    engine.add_request("same", [7, 8], PARAMS)
    with pytest.raises(ValueError, match="already in use"):
        engine.add_request("same", [7, 8], PARAMS)
    with pytest.raises(ValueError, match="out of vocabulary"):
        engine.add_request("other", [10**6], PARAMS)
    done = {}
    while engine.has_unfinished_requests():
        done.update({o.request_id: o for o in engine.step() if o.finished})
    assert list(done) == ["same"] and len(done["same"].outputs[0].token_ids) == 4


def test_priority_needs_priority_scheduling(engine):
    with pytest.raises(ValueError, match="scheduling_policy='priority'"):
        engine.add_request("urgent", [7, 8], PARAMS, priority=1)
    assert not engine.has_unfinished_requests()


@pytest.mark.parametrize("field, value", [
    ("temperature", -1.0), ("top_p", 0.0), ("top_p", 1.5), ("top_k", -2), ("min_p", 2.0),
    ("presence_penalty", 3.0), ("frequency_penalty", -3.0), ("repetition_penalty", 0.0),
    ("max_tokens", 0), ("min_tokens", -1), ("n", 0), ("logprobs", -2), ("prompt_logprobs", -5),
    ("stop", [""]), ("seed", 1.5), ("best_of", 3),
])
def test_invalid_sampling_values_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


def test_unknown_architecture_and_missing_path(tiny_checkpoint, tmp_path):
    from tamis.engine.engine import LLMEngine
    with pytest.raises(FileNotFoundError, match="does-not-exist"):
        LLMEngine(model=str(tmp_path / "does-not-exist"))
    folder = tmp_path / "weird"
    shutil.copytree(tiny_checkpoint("llama"), folder)
    config = json.loads((folder / "config.json").read_text())
    config["architectures"] = ["FancyNewForCausalLM"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="FancyNewForCausalLM"):
        LLMEngine(model=str(folder))


def test_invalid_engine_config_names_the_flag(tiny_checkpoint):
    from tamis.engine.engine import LLMEngine
    with pytest.raises(ValueError, match="--max-model-len 4096 exceeds"):
        LLMEngine(model=str(tiny_checkpoint("llama")), max_model_len=4096)
    with pytest.raises(ValueError, match="--max-model-len 400 does not fit in the KV cache"):
        LLMEngine(model=str(tiny_checkpoint("llama")), max_model_len=400, num_gpu_blocks_override=4)
    with pytest.raises(TypeError, match="max_model_length"):
        LLMEngine(model=str(tiny_checkpoint("llama")), max_model_length=10)
