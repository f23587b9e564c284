"""SamplingParams: vLLM's defaults, normalisation and validation."""
from __future__ import annotations

import pytest

from tamis.engine.sampling_params import RequestOutputKind, SamplingParams, SamplingType


def test_vllm_defaults():
    p = SamplingParams()
    assert (p.n, p.temperature, p.top_p, p.top_k, p.min_p) == (1, 1.0, 1.0, 0, 0.0)
    assert (p.max_tokens, p.min_tokens, p.seed, p.logprobs, p.prompt_logprobs) == (16, 0, None, None, None)
    assert (p.presence_penalty, p.frequency_penalty, p.repetition_penalty) == (0.0, 0.0, 1.0)
    assert p.stop == [] and p.stop_token_ids == [] and not p.ignore_eos
    assert p.detokenize and p.skip_special_tokens and p.spaces_between_special_tokens
    assert not p.include_stop_str_in_output and p.output_kind == RequestOutputKind.CUMULATIVE
    assert p.sampling_type == SamplingType.RANDOM


def test_normalisation():
    assert SamplingParams(top_k=-1).top_k == 0
    assert SamplingParams(stop="###").stop == ["###"]
    assert SamplingParams(logit_bias={"5": 1}).logit_bias == {5: 1.0}
    assert SamplingParams(stop_token_ids=[7]).all_stop_token_ids == {7}
    assert SamplingParams(seed=3).sampling_type == SamplingType.RANDOM_SEED


def test_greedy_resets_filters():
    p = SamplingParams(temperature=0.0, top_p=0.5, top_k=5, min_p=0.2)
    assert (p.top_p, p.top_k, p.min_p) == (1.0, 0, 0.0)
    assert p.sampling_type == SamplingType.GREEDY


@pytest.mark.parametrize("kwargs, field", [
    ({"n": 0}, "n"), ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"frequency_penalty": -2.5}, "frequency_penalty"), ({"repetition_penalty": -1.0}, "repetition_penalty"),
    ({"temperature": -0.1}, "temperature"), ({"top_p": 0.0}, "top_p"), ({"top_k": -5}, "top_k"),
    ({"top_k": 2.5}, "top_k"), ({"min_p": -0.1}, "min_p"), ({"seed": "x"}, "seed"),
    ({"max_tokens": 0}, "max_tokens"), ({"min_tokens": 5, "max_tokens": 4}, "min_tokens"),
    ({"logprobs": -2}, "logprobs"), ({"prompt_logprobs": 1.5}, "prompt_logprobs"),
    ({"stop": ["ok", ""]}, "stop"), ({"stop": ["x"], "detokenize": False}, "detokenize"),
    ({"stop_token_ids": [-1]}, "stop_token_ids"), ({"allowed_token_ids": []}, "allowed_token_ids"),
    ({"logit_bias": {"a": 1}}, "logit_bias"), ({"truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
    ({"best_of": 2}, "best_of"), ({"output_kind": "delta"}, "output_kind"),
    ({"seed": 2**63}, "seed"), ({"seed": -2**63 - 1}, "seed"), ({"n": 16385}, "n"),
    ({"logit_bias": {5: 100.5}}, "logit_bias"), ({"logit_bias": {5: -101}}, "logit_bias"),
])
def test_invalid_values_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=rf"\b{field}\b"):
        SamplingParams(**kwargs)


def test_clone_is_independent_but_keeps_the_spec():
    spec = object()
    p = SamplingParams(stop=["a"], structured_outputs=spec)
    q = p.clone()
    q.stop.append("b")
    assert p.stop == ["a"] and q.structured_outputs is spec
