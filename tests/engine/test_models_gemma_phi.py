"""Gemma 2, Gemma 3 (text) and Phi-3 (with and without LongRoPE) against transformers.

Tiny random checkpoints (``tests/tiny_models.py``) go through the same checks as the
Llama family: logits through the paged KV cache (one prefill, chunked prefill, mixed
prefill/decode batches, a plain forward), greedy tokens over 8 prompts, batch
invariance, preemption, prefix caching and a structured-output request each.
"""
from __future__ import annotations

import random
import re
from types import SimpleNamespace

import pytest
import torch

from engine_helpers import hf_greedy, make_engine, random_prompts, run_to_completion
# The shared paged-cache checks run here over this module's ``case`` fixture.
from test_models import (Case, test_chunked_prefill_matches_transformers,  # noqa: F401
                         test_forward_keeps_no_cos_sin_table,
                         test_mixed_prefill_and_decode_batches_match_transformers,
                         test_plain_forward_without_metadata_matches,
                         test_single_prefill_matches_transformers)
from test_preemption import _alone, _mixed_prompts
from tiny_models import LONGROPE
from tamis.engine.kv_groups import num_tensors
from tamis.engine.layers.layernorm import GemmaRMSNorm
from tamis.engine.layers.rotary import get_rope
from tamis.engine.loader import kv_cache_spec
from tamis.engine.sampling_params import SamplingParams

# name -> (tiny arch, config overrides). With LongRoPE's long factors transformers agrees
# only on sequences longer than the original context (64): those variants' prompts are.
VARIANTS = {"gemma2": ("gemma2", {}), "gemma3": ("gemma3", {}), "phi3": ("phi3", {}),
            "phi3-longrope": ("phi3", LONGROPE)}
LONG_PROMPTS = {"phi3-longrope"}
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


def checkpoint(tiny_checkpoint, name: str):
    arch, overrides = VARIANTS[name]
    return tiny_checkpoint(arch, **overrides)


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def case(request, tiny_checkpoint):
    if request.param in LONG_PROMPTS:
        return Case(checkpoint(tiny_checkpoint, request.param), len_a=90, len_b=70)
    return Case(checkpoint(tiny_checkpoint, request.param))


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_greedy_matches_transformers(tiny_checkpoint, name):
    path = checkpoint(tiny_checkpoint, name)
    lengths = (65, 70, 80, 96, 130, 200, 257, 310) if name in LONG_PROMPTS else None
    prompts = random_prompts(seed=3, **({"lengths": lengths} if lengths else {}))
    engine = make_engine(path)
    outputs = run_to_completion(engine, prompts, GREEDY)
    for prompt, output in zip(prompts, outputs):
        assert output.outputs[0].token_ids == hf_greedy(path, prompt, GREEDY.max_tokens), len(prompt)
    assert engine.kv_cache.num_free_blocks == engine.kv_cache.num_blocks


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_batch_invariance_and_preemption(tiny_checkpoint, name):
    path = checkpoint(tiny_checkpoint, name)
    prompts = _mixed_prompts(count=12, seed=5)
    alone = _alone(make_engine(path), prompts)
    together = run_to_completion(make_engine(path), prompts, GREEDY)
    assert [o.outputs[0].token_ids for o in together] == alone
    # The bytes of 8 blocks of every layer (a hybrid model's blocks hold fewer layers).
    spec = make_engine(path).runner.kv_spec
    num_blocks = 8 * spec.num_layers // num_tensors(spec.groups)
    small = make_engine(path, num_gpu_blocks_override=num_blocks, max_model_len=128,
                        max_num_seqs=12, max_num_batched_tokens=48)
    squeezed = run_to_completion(small, prompts, GREEDY)
    assert small.get_stats().num_preemptions > 0
    assert [o.outputs[0].token_ids for o in squeezed] == alone
    assert small.kv_cache.num_free_blocks == num_blocks


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_prefix_cache_hits_leave_the_output_unchanged(tiny_checkpoint, name):
    """A 100-token shared prefix: past Gemma's 16-token window, past LongRoPE's 64."""
    path = checkpoint(tiny_checkpoint, name)
    rng = random.Random(11)
    prefix = [rng.randrange(100, 49152) for _ in range(100)]
    prompts = [prefix + [rng.randrange(100, 49152) for _ in range(n)] for n in (5, 20)]
    cold = run_to_completion(make_engine(path, enable_prefix_caching=False), prompts, GREEDY)
    warm = make_engine(path)
    first = run_to_completion(warm, prompts[:1], GREEDY, prefix="a")[0]
    second = run_to_completion(warm, prompts[1:], GREEDY, prefix="b")[0]
    assert second.num_cached_tokens == 96
    assert [first.outputs[0].token_ids, second.outputs[0].token_ids] == \
        [o.outputs[0].token_ids for o in cold]


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_structured_output_satisfies_its_constraint(tiny_checkpoint, name):
    from tamis.constrain import StructuredOutputsParams

    engine = make_engine(checkpoint(tiny_checkpoint, name))
    regex = r"[a-c]{3}-[0-9]{2}"
    params = [SamplingParams(temperature=0.0, max_tokens=16,
                             structured_outputs=StructuredOutputsParams(regex=regex)),
              SamplingParams(temperature=0.0, max_tokens=16,
                             structured_outputs=StructuredOutputsParams(choice=["red", "blue"]))]
    prompt = random_prompts(lengths=(40,), seed=9)[0]
    by_regex, by_choice = run_to_completion(engine, [prompt, prompt], params)
    assert re.fullmatch(regex, by_regex.outputs[0].text), by_regex.outputs[0].text
    assert by_choice.outputs[0].text in ("red", "blue")
    assert by_regex.outputs[0].finish_reason == by_choice.outputs[0].finish_reason == "stop"


def test_triton_backend_with_soft_cap_matches_transformers(tiny_checkpoint):
    """Gemma 2 through the Triton kernels (interpreted on CPU): soft-capped prefill over a
    cached prefix and decodes past the sliding window."""
    from tamis.engine.attention.triton_backend import TritonAttentionBackend

    case = Case(checkpoint(tiny_checkpoint, "gemma2"), len_a=40, len_b=3)
    layers = [m for m in case.model.modules() if hasattr(m, "backend")]
    assert len(layers) == 2
    for module in layers:
        module.backend = TritonAttentionBackend(decode_num_splits=2)
    batcher = case.batcher(block_size=4)
    got = [batcher.run(case.model, [("a", case.ids_a[:20])])["a"],
           batcher.run(case.model, [("a", case.ids_a[20:30])])["a"]]
    got += [batcher.run(case.model, [("a", [t])])["a"] for t in case.ids_a[30:]]
    torch.testing.assert_close(torch.cat(got), case.ref_a, atol=1e-4, rtol=0)


# ----------------------------------------------------------------- pieces

def test_layer_windows_follow_layer_types(tiny_checkpoint):
    gemma2 = Case(checkpoint(tiny_checkpoint, "gemma2"), len_a=3, len_b=3).hf_config
    gemma3 = Case(checkpoint(tiny_checkpoint, "gemma3"), len_a=3, len_b=3).hf_config
    assert kv_cache_spec(gemma2).sliding_windows == (16, None)
    assert kv_cache_spec(gemma3).sliding_windows == (16,) * 5 + (None,)


def test_gemma3_layers_use_their_layer_type_rope(tiny_checkpoint):
    model = Case(checkpoint(tiny_checkpoint, "gemma3"), len_a=3, len_b=3).model
    local = get_rope(SimpleNamespace(rope_theta=1e4, max_position_embeddings=2048), 16).inv_freq
    global_ = get_rope(SimpleNamespace(rope_theta=1e6, max_position_embeddings=2048), 16).inv_freq
    layers = model.model.layers
    torch.testing.assert_close(layers[0].self_attn.rotary_emb.inv_freq, local)
    torch.testing.assert_close(layers[5].self_attn.rotary_emb.inv_freq, global_ / 4)
    assert layers[0].self_attn.rotary_emb.cache is not layers[5].self_attn.rotary_emb.cache


def test_older_gemma3_configs_read_rope_local_base_freq():
    config = SimpleNamespace(rope_theta=1e6, rope_local_base_freq=1e4,
                             rope_scaling={"rope_type": "linear", "factor": 8.0},
                             max_position_embeddings=2048)
    local = get_rope(config, 16, "sliding_attention").inv_freq
    global_ = get_rope(config, 16, "full_attention").inv_freq
    plain = SimpleNamespace(rope_theta=1e4, max_position_embeddings=2048)
    torch.testing.assert_close(local, get_rope(plain, 16).inv_freq)
    torch.testing.assert_close(global_ * 8, get_rope(SimpleNamespace(
        rope_theta=1e6, max_position_embeddings=2048), 16).inv_freq)


@pytest.mark.parametrize("max_position", [64, 2048])
def test_longrope_frequencies_and_scaling_equal_transformers(max_position):
    """Short factors while the checkpoint's context is the original one, long beyond it;
    the cos/sin scaling is transformers' attention factor."""
    from transformers import Phi3Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = Phi3Config(hidden_size=64, num_attention_heads=4, max_position_embeddings=max_position,
                        **LONGROPE)
    want, scaling = ROPE_INIT_FUNCTIONS["longrope"](config, "cpu", seq_len=max_position)
    rope = get_rope(config, 16)
    torch.testing.assert_close(rope.inv_freq, want)
    assert rope.attention_scaling == pytest.approx(scaling)
    assert (scaling > 1.0) == (max_position > 64)


def test_longrope_factor_count_is_checked():
    params = {**LONGROPE["rope_parameters"], "long_factor": [1.0] * 3}
    config = SimpleNamespace(rope_parameters=params, max_position_embeddings=2048)
    with pytest.raises(ValueError, match="long_factor has 3 entries"):
        get_rope(config, 16)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gemma_rms_norm_equals_transformers_bit_for_bit(dtype):
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm

    ours, theirs = GemmaRMSNorm(64, 1e-6), Gemma3RMSNorm(64, 1e-6)
    weight = torch.randn(64) * 0.3
    ours.weight.data.copy_(weight)
    theirs.weight.data.copy_(weight)
    x, residual = torch.randn(5, 64, dtype=dtype), torch.randn(5, 64, dtype=dtype)
    with torch.no_grad():
        assert torch.equal(ours(x), theirs(x))
        normed, summed = ours(x, residual)
        assert torch.equal(summed, x + residual) and torch.equal(normed, theirs(x + residual))


def test_embedding_scale_rounds_as_transformers_in_bfloat16():
    """sqrt(3584) is rounded to bf16 (59.75) before the product, as transformers does."""
    from transformers.models.gemma2.modeling_gemma2 import Gemma2TextScaledWordEmbedding

    from tamis.engine.layers.embedding import VocabEmbedding

    weight = torch.randn(50, 3584).to(torch.bfloat16)
    theirs = Gemma2TextScaledWordEmbedding(50, 3584, 0, embed_scale=3584 ** 0.5)
    theirs.embed_scale.fill_(3584 ** 0.5)
    theirs = theirs.to(torch.bfloat16)
    theirs.weight.data.copy_(weight)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)   # as the loader builds a bf16 model
    try:
        ours = VocabEmbedding(50, 3584, 3584 ** 0.5)
    finally:
        torch.set_default_dtype(previous)
    ours.weight.data.copy_(weight)
    assert ours.scale == 59.75
    ids = torch.arange(50)
    with torch.no_grad():
        assert torch.equal(ours(ids), theirs(ids))


# ----------------------------------------------------------------- GPU

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", sorted(VARIANTS))
@pytest.mark.parametrize("backend", ["torch", "auto"])
def test_cuda_paged_runs_match_transformers(tiny_checkpoint, name, backend):
    """fp32 on CUDA (with "auto", the Triton kernels and Gemma 2's soft-cap in them)
    equals transformers; bf16 (dtype auto) picks the same tokens."""
    from test_models import check_cuda_paged_run, reference_logits

    path = checkpoint(tiny_checkpoint, name)
    ids = random_prompts(lengths=(100,), seed=4)[0]
    check_cuda_paged_run(path, backend, ids, reference_logits(path, ids)[0].cuda(), prefill=70)
