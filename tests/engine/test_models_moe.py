"""Mixture-of-experts models (Mixtral, Qwen3-MoE, Qwen2-MoE) against transformers (fp32).

The dense models' logit checks (``test_models``) run here on tiny MoE checkpoints, then
the engine end to end: greedy tokens equal transformers' over 8 prompts, a request's
tokens do not depend on its batch, on prefix-cache hits or on preemption, and
structured outputs hold. Loading: stacked experts, layer selection, refusals.
Quantized experts: ``test_models_moe_quant``.
"""
from __future__ import annotations

import json
import random

import pytest
import torch

from engine_helpers import hf_greedy, make_engine, random_prompts, run_to_completion
from tamis.engine.layers.fused_moe import FusedMoE, SparseMoeBlock
from tamis.engine.loader import load_model
from tamis.engine.models.llama import LlamaMLP
from tamis.engine.sampling_params import SamplingParams
# The dense models' logit checks, collected here again with this module's ``case``.
from test_models import (ATOL, Case, engine_config,  # noqa: F401
                         test_chunked_prefill_matches_transformers,
                         test_mixed_prefill_and_decode_batches_match_transformers,
                         test_single_prefill_matches_transformers)

MOE_ARCHS = ("mixtral", "qwen3_moe", "qwen2_moe")
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


@pytest.fixture(scope="module", params=MOE_ARCHS)
def case(request, tiny_checkpoint):
    return Case(tiny_checkpoint(request.param))


@pytest.mark.parametrize("arch", MOE_ARCHS)
def test_greedy_matches_transformers(tiny_checkpoint, arch):
    path = tiny_checkpoint(arch)
    prompts = random_prompts(seed=len(arch))
    engine = make_engine(path)
    outputs = run_to_completion(engine, prompts, GREEDY)
    for prompt, output in zip(prompts, outputs):
        expected = hf_greedy(path, prompt, GREEDY.max_tokens)
        assert output.outputs[0].token_ids == expected, len(prompt)
    assert engine.kv_cache.num_free_blocks == engine.kv_cache.num_blocks


def _shared_prefix_prompts(count: int = 12) -> list[list[int]]:
    """The first prompt holds the whole 40-token prefix; the others 0, 17 or 40 of it."""
    rng = random.Random(5)
    prefix = [rng.randrange(100, 49152) for _ in range(40)]
    shared = [40] + [rng.choice([0, 17, 40]) for _ in range(count - 1)]
    return [prefix[:n] + [rng.randrange(100, 49152) for _ in range(rng.choice([1, 9, 30]))]
            for n in shared]


def _tokens(outputs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outputs]


@pytest.mark.parametrize("arch", ["mixtral", "qwen3_moe"])
def test_batch_prefix_cache_and_preemption_leave_tokens_unchanged(tiny_checkpoint, arch):
    """Alone (no cache) = together (cache hits) = squeezed into 8 blocks (preempted)."""
    path, prompts = tiny_checkpoint(arch), _shared_prefix_prompts()
    cold = make_engine(path, enable_prefix_caching=False)
    alone = [_tokens(run_to_completion(cold, [p], GREEDY, prefix=f"a{i}-"))[0]
             for i, p in enumerate(prompts)]
    warm = make_engine(path)
    run_to_completion(warm, prompts[:1], GREEDY, prefix="warmup")
    assert _tokens(run_to_completion(warm, prompts, GREEDY)) == alone
    assert warm.get_stats().prefix_cache_hits > 0
    small = make_engine(path, num_gpu_blocks_override=8, max_model_len=96, max_num_seqs=12)
    assert _tokens(run_to_completion(small, prompts, GREEDY)) == alone
    assert small.get_stats().num_preemptions > 0
    assert small.kv_cache.num_free_blocks == 8


@pytest.mark.parametrize("arch", ["mixtral", "qwen3_moe"])
def test_structured_outputs(tiny_checkpoint, arch):
    from tamis.constrain import StructuredOutputsParams

    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
              "additionalProperties": False}
    params = [SamplingParams(temperature=0.0, max_tokens=12,
                             structured_outputs=StructuredOutputsParams(choice=["red", "blue"])),
              SamplingParams(temperature=0.0, max_tokens=40,
                             structured_outputs=StructuredOutputsParams(json=schema))]
    engine = make_engine(tiny_checkpoint(arch))
    choice, obj = run_to_completion(engine, [[500, 600, 700], [800, 900]], params)
    assert choice.outputs[0].text in ("red", "blue")
    assert obj.outputs[0].finish_reason == "stop"
    assert isinstance(json.loads(obj.outputs[0].text)["n"], int)


def test_triton_experts_in_the_model_match_transformers(tiny_checkpoint, monkeypatch):
    """The path CUDA takes (sorted grouped GEMMs), here interpreted on CPU tensors."""
    from tamis.kernels import fused_moe

    calls = []

    def triton_path(*args):
        calls.append(args[0].shape[0])
        return fused_moe.fused_experts_triton(*args)

    monkeypatch.setattr(fused_moe, "fused_experts", triton_path)
    case = Case(tiny_checkpoint("mixtral"), len_a=24, len_b=3)
    logits = case.batcher().run(case.model, [("a", case.ids_a)])["a"]
    torch.testing.assert_close(logits, case.ref_a, atol=ATOL, rtol=0)
    assert calls == [24, 24]


# ----------------------------------------------------------------- loading

def test_qwen3_moe_layers_follow_sparse_step_and_mlp_only_layers(tiny_checkpoint):
    path = tiny_checkpoint("qwen3_moe", num_hidden_layers=4, decoder_sparse_step=2,
                           mlp_only_layers=[3])
    case = Case(path, len_a=30, len_b=3)
    kinds = [type(layer.mlp) for layer in case.model.model.layers]
    assert kinds == [LlamaMLP, SparseMoeBlock, LlamaMLP, LlamaMLP]
    logits = case.batcher().run(case.model, [("a", case.ids_a)])["a"]
    torch.testing.assert_close(logits, case.ref_a, atol=ATOL, rtol=0)


def test_mixtral_experts_are_stacked_from_the_per_expert_tensors(tiny_checkpoint):
    from safetensors import safe_open

    path = tiny_checkpoint("mixtral")
    model, _ = load_model(engine_config(path), "cpu")
    experts = model.model.layers[1].block_sparse_moe.experts
    assert isinstance(experts, FusedMoE) and experts.w13_weight.shape == (4, 64, 64)
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        prefix = "model.layers.1.block_sparse_moe.experts.3"
        w1, w3, w2 = (f.get_tensor(f"{prefix}.{p}.weight") for p in ("w1", "w3", "w2"))
    assert torch.equal(experts.w13_weight[3], torch.cat([w1, w3]))
    assert torch.equal(experts.w2_weight[3], w2)


def test_bad_expert_tensors_are_named(tiny_checkpoint):
    model, _ = load_model(engine_config(tiny_checkpoint("mixtral")), "cpu")
    name = "model.layers.0.block_sparse_moe.experts.{}.w2.weight"
    with pytest.raises(ValueError, match="expert 4 is out of range"):
        model.load_weights([(name.format(4), torch.zeros(64, 32))])
    with pytest.raises(ValueError, match=r"expects \(64, 32\)"):
        model.load_weights([(name.format(1), torch.zeros(32, 64))])
    loaded = {n for n in model.expected_checkpoint_names() if n != name.format(2)}
    with pytest.raises(ValueError, match=r"missing tensor\(s\) '.*experts\.2\.w2\.weight'"):
        model.check_all_loaded(loaded)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("arch", ["mixtral", "qwen3_moe"])
def test_cuda_paged_runs_match_transformers(arch, tmp_path):
    """fp32 on CUDA (Triton experts) equals transformers; bf16 picks the same tokens."""
    from transformers import AutoModelForCausalLM

    from paged_harness import PagedBatcher
    from tamis.engine.loader import kv_cache_spec
    from tiny_models import make_tiny_checkpoint

    path = make_tiny_checkpoint(arch, tmp_path, with_tokenizer=False)
    ref = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).cuda().eval()
    ids = torch.randint(0, 49152, (40,), generator=torch.Generator().manual_seed(0)).tolist()
    with torch.no_grad():
        expected = ref(torch.tensor([ids], device="cuda")).logits[0].float()
    for dtype in ("float32", "bfloat16"):
        model, hf_config = load_model(engine_config(path, dtype=dtype), "cuda")
        batcher = PagedBatcher(kv_cache_spec(hf_config), num_blocks=32, block_size=16,
                               dtype=model.dtype, device="cuda")
        got = [batcher.run(model, [("a", ids[:25])])["a"]]
        got += [batcher.run(model, [("a", [t])])["a"] for t in ids[25:]]
        got = torch.cat(got)
        if dtype == "float32":
            torch.testing.assert_close(got, expected, atol=2e-3, rtol=0)
        else:
            assert (got.argmax(-1) == expected.argmax(-1)).float().mean().item() >= 0.9
