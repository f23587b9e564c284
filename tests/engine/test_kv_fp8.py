"""FP8 KV cache through the engine: the flag, scales from the checkpoint, twice the blocks
per byte, perplexity on the embedded model, and prefix caching, preemption and structured
outputs unchanged."""
from __future__ import annotations

import math
import re
import shutil

import pytest
import torch
from safetensors.torch import save_file

from engine_helpers import make_engine, run_to_completion
from tamis.engine.config import EngineConfig, resolve_kv_cache_dtype
from tamis.engine.loader import KVCacheSpec
from tamis.constrain import StructuredOutputsParams
from tamis.engine.sampling_params import SamplingParams

PARAMS = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)

# A fixed English text (written for this test) for the perplexity check.
TEXT = (
    "The river rises in the hills to the north of the town and runs south through a wide "
    "valley of farms and small woods. In spring the water is high and fast, and the old "
    "stone bridge near the market is sometimes closed for a day or two. Most of the year, "
    "though, the river is slow and shallow, and children wade across it in the summer to "
    "reach the island where the herons nest. The town grew up around the mill that stood "
    "beside the bridge. For two hundred years the mill ground wheat and barley for the "
    "farms of the valley, and the miller was often the richest man in the parish. When the "
    "railway came, larger mills in the cities took the trade, and the building was turned "
    "into a school, then a warehouse, and finally a museum of local history. Visitors can "
    "still see the great wheel, the grinding stones and the ledgers in which the millers "
    "recorded every sack they bought and sold, with the names of the farmers and the "
    "prices they were paid in good years and bad."
)


@pytest.mark.parametrize("name", ["fp8", "fp8_e4m3"])
def test_fp8_names_resolve_to_e4m3(name):
    assert EngineConfig(kv_cache_dtype=name).kv_cache_dtype == name
    assert resolve_kv_cache_dtype(name, torch.bfloat16, torch.device("cpu")) == torch.float8_e4m3fn
    assert resolve_kv_cache_dtype("auto", torch.bfloat16, torch.device("cpu")) == torch.bfloat16


@pytest.mark.parametrize("name,message", [("fp8_e5m2", "fp8_e5m2 is not supported"),
                                          ("int8", "--kv-cache-dtype must be one of")])
def test_unsupported_kv_cache_dtypes_are_refused(name, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(kv_cache_dtype=name)


@pytest.mark.parametrize("wide", [torch.bfloat16, torch.float16])
def test_same_budget_holds_twice_the_blocks(tiny_checkpoint, wide):
    spec = KVCacheSpec(num_layers=30, num_kv_heads=3, head_dim=64, sliding_windows=(None,) * 30)
    assert spec.block_bytes(16, wide) == 2 * spec.block_bytes(16, torch.float8_e4m3fn)
    path = tiny_checkpoint("llama")
    blocks = {}
    for kv_dtype in ("auto", "fp8"):
        engine = make_engine(path, dtype=str(wide).split(".")[1], kv_cache_dtype=kv_dtype,
                             kv_cache_memory_bytes="1MiB", max_model_len=2048)
        blocks[kv_dtype] = engine.get_stats().num_total_blocks
        assert engine.runner.kv_caches[0].dtype == (wide if kv_dtype == "auto"
                                                    else torch.float8_e4m3fn)
    assert blocks["fp8"] == 2 * blocks["auto"]


def _with_scales(tiny_checkpoint, tmp_path, tensors: dict[str, torch.Tensor]):
    folder = tmp_path / "scaled"
    shutil.copytree(tiny_checkpoint("llama"), folder)
    save_file(tensors, str(folder / "kv_scales.safetensors"))
    return folder


def _attention_scales(engine) -> list[tuple[float, float]]:
    layers = engine.runner.model.model.layers
    return [(layer.self_attn.attn.k_scale, layer.self_attn.attn.v_scale) for layer in layers]


@pytest.mark.parametrize("names", [
    ("model.layers.{i}.self_attn.k_scale", "model.layers.{i}.self_attn.v_scale"),
    ("model.layers.{i}.self_attn.k_proj.output_scale", "model.layers.{i}.self_attn.v_proj.output_scale"),
])
def test_scales_come_from_the_checkpoint(tiny_checkpoint, tmp_path, names):
    num_layers = make_engine(tiny_checkpoint("llama")).hf_config.num_hidden_layers
    tensors = {}
    for i in range(num_layers - 1):   # the last layer has none: it keeps 1.0
        tensors[names[0].format(i=i)] = torch.tensor(0.01 * (i + 1))
        tensors[names[1].format(i=i)] = torch.tensor([0.02 * (i + 1)])
    engine = make_engine(_with_scales(tiny_checkpoint, tmp_path, tensors), kv_cache_dtype="fp8")
    want = [(pytest.approx(0.01 * (i + 1)), pytest.approx(0.02 * (i + 1)))
            for i in range(num_layers - 1)] + [(1.0, 1.0)]
    assert _attention_scales(engine) == want
    out = run_to_completion(engine, [[101, 202, 303, 404]], PARAMS)[0]
    assert len(out.outputs[0].token_ids) == 8


def test_one_kv_scale_sets_both(tiny_checkpoint, tmp_path):
    tensors = {"model.layers.0.self_attn.kv_scale": torch.tensor(0.5)}
    engine = make_engine(_with_scales(tiny_checkpoint, tmp_path, tensors), kv_cache_dtype="fp8")
    assert _attention_scales(engine)[0] == (0.5, 0.5)


@pytest.mark.parametrize("tensor,message", [(torch.ones(4), "must hold one value"),
                                            (torch.tensor(-1.0), "positive finite")])
def test_bad_scales_are_refused_naming_the_tensor(tiny_checkpoint, tmp_path, tensor, message):
    tensors = {"model.layers.0.self_attn.k_scale": tensor}
    with pytest.raises(ValueError, match=rf"model\.layers\.0\.self_attn\.k_scale.*{message}"):
        make_engine(_with_scales(tiny_checkpoint, tmp_path, tensors), kv_cache_dtype="fp8")


def _paged_perplexity(engine, ids: list[int]) -> float:
    """exp of the mean NLL of ids[1:], each token's logprob read from the paged run."""
    params = SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)
    out = run_to_completion(engine, [ids], params)[0]
    nll = [-out.prompt_logprobs[i][token].logprob for i, token in enumerate(ids) if i]
    return math.exp(sum(nll) / len(nll))


def test_perplexity_of_the_embedded_model_barely_moves(smollm2_path):
    """SmolLM2 in fp32 over TEXT (~220 tokens), cache in fp32 against e4m3 with scales of
    0.05 (|k| <= 20 and |v| <= 13 here stay inside e4m3's range). On a text this short
    where e4m3 rounds moves perplexity by up to 2% either way (unit scales: -1.1%, these:
    +1.9%; over 4,096 tokens see bench/bench_kv_cache_ppl.py); a scale lost on either side
    of the cache moves it by far more."""
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(smollm2_path)(TEXT)["input_ids"]
    assert len(ids) > 200
    ppl = {}
    for kv_dtype in ("auto", "fp8"):
        # Chunks of 64 tokens: most keys are read back from the cache of earlier chunks.
        engine = make_engine(smollm2_path, kv_cache_dtype=kv_dtype, max_model_len=512,
                             max_num_batched_tokens=64, max_num_seqs=4)
        for layer in engine.runner.model.model.layers:
            layer.self_attn.attn.k_scale = layer.self_attn.attn.v_scale = 0.05
        ppl[kv_dtype] = _paged_perplexity(engine, ids)
    change = ppl["fp8"] / ppl["auto"] - 1
    assert abs(change) <= 0.03, f"perplexity {ppl['auto']:.4f} -> {ppl['fp8']:.4f} ({change:+.2%})"
    assert ppl["fp8"] != ppl["auto"], "the FP8 run must read a quantized cache"


def test_prefix_cache_hits_give_the_uncached_output(tiny_checkpoint):
    path = tiny_checkpoint("llama")
    prefix = list(range(300, 400))
    prompts = [prefix + [7, 8, 9], prefix + list(range(500, 520))]
    cold = run_to_completion(make_engine(path, kv_cache_dtype="fp8", enable_prefix_caching=False),
                             prompts, PARAMS)
    warm = make_engine(path, kv_cache_dtype="fp8")
    outs = [run_to_completion(warm, [p], PARAMS, prefix=f"w{i}")[0] for i, p in enumerate(prompts)]
    assert outs[1].num_cached_tokens == 96
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in cold]


def test_preemption_recomputes_the_same_tokens(tiny_checkpoint):
    path = tiny_checkpoint("llama")
    prompts = [[100 + 37 * i + j for j in range(n)] for i, n in enumerate((9, 33, 60, 17, 95, 40))]
    alone = [run_to_completion(make_engine(path, kv_cache_dtype="fp8"), [p], PARAMS)[0]
             for p in prompts]
    small = make_engine(path, kv_cache_dtype="fp8", num_gpu_blocks_override=10, max_model_len=160,
                        max_num_seqs=6)
    squeezed = run_to_completion(small, prompts, PARAMS)
    assert small.get_stats().num_preemptions > 0
    assert [o.outputs[0].token_ids for o in squeezed] == [o.outputs[0].token_ids for o in alone]


def test_structured_output_follows_its_regex(tiny_checkpoint):
    engine = make_engine(tiny_checkpoint("llama"), kv_cache_dtype="fp8")
    pattern = r"[0-9]{3}-[a-z]{4}"
    params = SamplingParams(temperature=0.0, max_tokens=24,
                            structured_outputs=StructuredOutputsParams(regex=pattern))
    out = run_to_completion(engine, [[500, 600, 700]], params)[0].outputs[0]
    assert out.finish_reason == "stop"
    assert re.fullmatch(pattern, out.text), out.text
