"""The sampler on synthetic logits: every parameter, in isolation and batched."""
from __future__ import annotations

import pytest
import torch

from tamis.engine.request import Request
from tamis.engine.sampler import (Sampler, SamplingMetadata, apply_min_p, apply_top_k_top_p,
                                  _apply_token_bitmask_local)
from tamis.engine.sampling_params import SamplingParams

V = 64


def _requests(*params_list, prompt=(1, 2, 3), outputs=()):
    requests = []
    for i, params in enumerate(params_list):
        r = Request(f"r{i}", list(prompt), params)
        for t in outputs:
            r.append_output_token(t)
        if params.seed is not None:
            r.generator = torch.Generator().manual_seed(params.seed)
        requests.append(r)
    return requests


def _sample(requests, logits, **kwargs):
    meta = SamplingMetadata.build(requests, V, torch.device("cpu"))
    return Sampler()(logits.clone(), meta, **kwargs)


def test_greedy_is_argmax():
    logits = torch.randn(3, V)
    out = _sample(_requests(*[SamplingParams(temperature=0)] * 3), logits)
    assert out.token_ids == logits.argmax(-1).tolist() and out.logprobs is None


def test_logit_bias_and_allowed_token_ids():
    logits = torch.zeros(2, V)
    logits[:, 5] = 3.0
    out = _sample(_requests(SamplingParams(temperature=0, logit_bias={9: 10.0}),
                            SamplingParams(temperature=0, allowed_token_ids=[11, 12])), logits)
    assert out.token_ids == [9, 11]


def test_bitmask_rows():
    logits = torch.randn(3, V)
    bitmask = torch.zeros(1, 2, dtype=torch.int32)
    bitmask[0, 1] = 1 << 3                                     # only token 35 allowed
    out = _sample(_requests(*[SamplingParams(temperature=0)] * 3), logits, bitmask=bitmask,
                  bitmask_rows=[1])
    assert out.token_ids[1] == 35
    assert out.token_ids[0] == logits[0].argmax() and out.token_ids[2] == logits[2].argmax()


def test_local_bitmask_matches_the_kernel_reference():
    from tamis.kernels.bitmask import apply_token_bitmask_ref
    logits = torch.randn(4, 100)
    bitmask = torch.randint(-2**31, 2**31 - 1, (4, 4), dtype=torch.int32)
    ours, ref = logits.clone(), logits.clone()
    _apply_token_bitmask_local(ours, bitmask)
    apply_token_bitmask_ref(ref, bitmask)
    assert torch.equal(ours, ref)


def test_penalties_follow_vllm():
    logits = torch.tensor([[2.0, -2.0, 1.0, 0.5] + [0.0] * (V - 4)])
    rep = _requests(SamplingParams(temperature=0, repetition_penalty=2.0), prompt=(0,), outputs=(1,))
    meta = SamplingMetadata.build(rep, V, torch.device("cpu"))
    from tamis.engine.sampler import apply_penalties
    x = logits.clone()
    apply_penalties(x, rep)
    assert x[0, :4].tolist() == [1.0, -4.0, 1.0, 0.5]          # seen: positive /2, negative *2
    freq = _requests(SamplingParams(frequency_penalty=0.5, presence_penalty=0.25),
                     prompt=(2,), outputs=(0, 0, 3))
    x = logits.clone()
    apply_penalties(x, freq)
    # output counts: token 0 twice, token 3 once; the prompt token 2 is not penalised.
    assert x[0, :4].tolist() == [2.0 - 1.0 - 0.25, -2.0, 1.0, 0.5 - 0.5 - 0.25]
    assert meta.any_penalties


def test_min_tokens_masks_stop_ids_until_reached():
    params = SamplingParams(temperature=0, min_tokens=2, stop_token_ids=[7])
    params.all_stop_token_ids |= {4}                           # EOS, as the engine adds it
    logits = torch.zeros(1, V)
    logits[0, 4], logits[0, 7], logits[0, 8] = 5.0, 4.0, 1.0
    assert _sample(_requests(params, outputs=(9,)), logits).token_ids == [8]
    assert _sample(_requests(params, outputs=(9, 9)), logits).token_ids == [4]


def test_top_k_top_p_min_p_filters():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = lambda x: torch.isfinite(x[0]).nonzero().flatten().tolist()  # noqa: E731
    assert kept(apply_top_k_top_p(logits.clone(), torch.tensor([2]), None)) == [0, 1]
    assert kept(apply_top_k_top_p(logits.clone(), None, torch.tensor([0.7]))) == [0, 1]
    assert kept(apply_top_k_top_p(logits.clone(), None, torch.tensor([0.81]))) == [0, 1, 2]
    assert kept(apply_top_k_top_p(logits.clone(), None, torch.tensor([0.01]))) == [0]
    probs = apply_min_p(logits.softmax(-1), torch.tensor([0.5]))
    assert (probs[0] > 0).nonzero().flatten().tolist() == [0, 1]


@pytest.mark.parametrize("params, allowed", [
    (SamplingParams(top_k=2, seed=0), {0, 1}), (SamplingParams(top_p=0.7, seed=0), {0, 1}),
    (SamplingParams(min_p=0.5, seed=0), {0, 1})])
def test_sampling_respects_filters(params, allowed):
    logits = torch.full((1, V), -30.0)
    logits[0, :4] = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    request = _requests(params)[0]
    meta = SamplingMetadata.build([request], V, torch.device("cpu"))
    seen = {Sampler()(logits.clone(), meta).token_ids[0] for _ in range(200)}
    assert seen == allowed


def test_temperature_sharpens_and_flattens():
    logits = torch.zeros(1, V)
    logits[0, 0] = 2.0
    def share_of_top(temperature):
        request = _requests(SamplingParams(temperature=temperature, seed=1))[0]
        meta = SamplingMetadata.build([request], V, torch.device("cpu"))
        return sum(Sampler()(logits.clone(), meta).token_ids[0] == 0 for _ in range(300)) / 300
    assert share_of_top(0.1) > 0.99 and share_of_top(5.0) < 0.2


def test_seeded_rows_are_independent_of_the_batch():
    logits = torch.randn(4, V)
    seeded = SamplingParams(temperature=1.0, seed=42)
    alone = _sample(_requests(seeded), logits[2:3]).token_ids[0]
    again = _sample(_requests(seeded), logits[2:3]).token_ids[0]
    batch_requests = _requests(SamplingParams(), SamplingParams(seed=7), seeded, SamplingParams())
    meta = SamplingMetadata.build(batch_requests, V, torch.device("cpu"))
    in_batch = Sampler()(logits.clone(), meta).token_ids[2]
    assert alone == again == in_batch
    # Draws from one generator continue its stream: a second step differs from the first.
    request = _requests(seeded)[0]
    meta = SamplingMetadata.build([request], V, torch.device("cpu"))
    draws = [Sampler()(logits[2:3].clone(), meta).token_ids[0] for _ in range(20)]
    assert len(set(draws)) > 1


def test_logprobs_ranks_and_top_k():
    logits = torch.log(torch.tensor([[0.1, 0.6, 0.3] + [1e-9] * (V - 3)]))
    params = SamplingParams(temperature=0, logprobs=2, allowed_token_ids=[2])
    out = _sample(_requests(params), logits)
    assert out.token_ids == [2]
    top = out.logprobs
    # Raw logprobs (before allowed_token_ids): token 2 is the 2nd most likely.
    assert top.token_ids[0].tolist() == [2, 1, 2] and top.ranks.tolist() == [2]
    assert top.logprobs[0, 0].item() == pytest.approx(torch.log_softmax(logits, -1)[0, 2].item())
