"""The GPU benchmarks' model shapes (bench/shapes.py) on the CPU.

At full size each shape is built on the meta device and must have the published
parameter counts; scaled down (same fields, smaller sizes) each must compute in tamis
what transformers computes from the same config.json and weights, and must serve from
dummy weights as the benchmarks load it (bf16 and online FP8). The benchmark scripts
must offer every shape.
"""
from __future__ import annotations

import importlib.util
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parent.parent / "bench"


def _load_shapes():
    spec = importlib.util.spec_from_file_location("bench_shapes", BENCH / "shapes.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


shapes = _load_shapes()

# (total, active) parameters in billions as their publishers state them: Llama-3.1-8B's
# model card (8.03B, dense), Qwen3-30B-A3B's (30.5B, 3.3B activated), Mixtral-8x7B's
# release (46.7B, 12.9B active).
PUBLISHED = {"llama-3.1-8b": (8.03, 8.03), "qwen3-30b-a3b": (30.5, 3.3),
             "mixtral-8x7b": (46.7, 12.9)}
TINY_VOCAB = 512


def _model_class_and_config(folder: Path):
    from transformers import AutoConfig
    from tamis.engine.models.registry import get_model_class
    config = AutoConfig.from_pretrained(folder)
    return get_model_class(config), config


def _num_experts(config: dict) -> int:
    return config.get("num_experts") or config.get("num_local_experts") or 0


@pytest.mark.parametrize("shape", sorted(shapes.SHAPES))
def test_full_size_shape_has_the_published_parameter_counts(shape, tmp_path):
    from tamis.engine.attention.backends import get_attention_backend
    model_cls, config = _model_class_and_config(shapes.write_shape_config(shape, tmp_path))
    with torch.device("meta"):
        model = model_cls(config, None, get_attention_backend("torch", "cpu"))
    params = dict(model.named_parameters())
    total = sum(p.numel() for p in params.values())
    experts = sum(p.numel() for name, p in params.items() if ".experts." in name)
    fields = shapes.SHAPES[shape]
    unused = 1 - fields.get("num_experts_per_tok", 1) / max(_num_experts(fields), 1)
    active = total - experts * unused
    published_total, published_active = PUBLISHED[shape]
    assert total / 1e9 == pytest.approx(published_total, rel=5e-3)
    # Publishers round the active count to 0.1B and differ on counting the embedding.
    assert active / 1e9 == pytest.approx(published_active, rel=3e-2)
    assert (experts > 0) == (_num_experts(fields) > 0)


def scaled_down(shape: str) -> dict:
    """Overrides that shrink ``shape`` to a CPU model and keep everything else: the
    architecture, the query / KV head ratio, q width against hidden width, top-k routing,
    its renormalisation and which layers are sparse. Qwen3's 128 experts become 16, so
    choosing 8 of them is still a choice; Mixtral keeps its 8."""
    full = shapes.SHAPES[shape]
    tiny = dict(vocab_size=TINY_VOCAB, num_hidden_layers=2, hidden_size=full["hidden_size"] // 64,
                head_dim=16, num_attention_heads=full["num_attention_heads"] // 4,
                num_key_value_heads=full["num_key_value_heads"] // 4,
                intermediate_size=full["intermediate_size"] // 64, max_position_embeddings=1024,
                bos_token_id=1, eos_token_id=2,
                # Wide random weights give distinct logits, so a misread field shows.
                initializer_range=0.2)
    if "moe_intermediate_size" in full:
        tiny["moe_intermediate_size"] = full["moe_intermediate_size"] // 16
    if "num_experts" in full:
        tiny["num_experts"] = 16
    return tiny


def _prompts(count: int, length: int, seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, TINY_VOCAB, (count, length), generator=generator).tolist()


def _tamis(folder: Path, **engine_args):
    from tamis.engine.llm import LLM
    return LLM(model=str(folder), dtype="float32", skip_tokenizer_init=True, device="cpu",
               kv_cache_memory_bytes="32MiB", max_model_len=256, **engine_args)


@pytest.mark.parametrize("shape", sorted(shapes.SHAPES))
def test_scaled_down_shape_matches_transformers(shape, tmp_path):
    """Each prompt token's log-probability under tamis equals transformers' on the same
    random weights (the config's fields are read the same way by both)."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from tamis.engine.sampling_params import SamplingParams
    folder = shapes.write_shape_config(shape, tmp_path, **scaled_down(shape))
    torch.manual_seed(0)
    reference = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder),
                                                 dtype=torch.float32).eval()
    reference.save_pretrained(folder)
    shapes.write_shape_config(shape, folder, **scaled_down(shape))   # tamis reads ours, as benched
    prompts = _prompts(2, 24, seed=len(shape))
    with torch.no_grad():
        expected = reference(torch.tensor(prompts)).logits.log_softmax(-1)
    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False)
    outputs = _tamis(folder).generate([{"prompt_token_ids": p} for p in prompts], params,
                                      use_tqdm=False)
    for row, (prompt, output) in enumerate(zip(prompts, outputs)):
        got = [entry[token].logprob for token, entry in
               zip(prompt[1:], output.prompt_logprobs[1:])]
        want = expected[row, torch.arange(len(prompt) - 1), prompt[1:]].tolist()
        assert max(want) - min(want) > 0.5   # the check can tell positions apart
        assert got == pytest.approx(want, abs=2e-4)


@pytest.mark.parametrize("shape, quantization", [
    ("llama-3.1-8b", None), ("qwen3-30b-a3b", None), ("mixtral-8x7b", None),
    ("qwen3-30b-a3b", "fp8"), ("mixtral-8x7b", "fp8")])
def test_scaled_down_shape_serves_dummy_weights(shape, quantization, tmp_path):
    """The benchmarks' load: config.json alone, load_format='dummy', token-id prompts."""
    from tamis.engine.sampling_params import SamplingParams
    folder = shapes.write_shape_config(shape, tmp_path, **scaled_down(shape))
    llm = _tamis(folder, load_format="dummy", quantization=quantization)
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True, logprobs=1,
                            detokenize=False)
    outputs = llm.generate([{"prompt_token_ids": p} for p in _prompts(3, 17, seed=1)], params,
                           use_tqdm=False)
    for output in outputs:
        completion = output.outputs[0]
        assert len(completion.token_ids) == 4
        assert all(0 <= token < TINY_VOCAB for token in completion.token_ids)
        assert all(math.isfinite(step[token].logprob)
                   for token, step in zip(completion.token_ids, completion.logprobs))


def test_prompt_ids_stay_inside_every_vocabulary():
    assert shapes.prompt_vocab("llama-3.1-8b") == 128000   # the prompts W1 always drew
    assert shapes.prompt_vocab("mixtral-8x7b") == 32000
    assert shapes.prompt_vocab("qwen3-30b-a3b") == 128000
    with pytest.raises(ValueError, match="--shape takes one of"):
        shapes.write_shape_config("gpt-2", Path("unused"))


@pytest.mark.parametrize("script", ["bench_offline.py", "bench_latency.py", "bench_vllm.py"])
def test_benchmark_scripts_offer_every_shape(script):
    result = subprocess.run([sys.executable, str(BENCH / script), "--help"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    help_text = " ".join(result.stdout.split())
    assert "--quantization" in help_text
    for shape in shapes.SHAPES:
        assert shape in help_text
