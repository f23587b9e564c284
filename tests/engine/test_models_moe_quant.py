"""Quantized mixture-of-experts checkpoints (AWQ, GPTQ, compressed-tensors W4A16 and FP8,
serialized FP8, online FP8) load into tamis with their experts kept quantized and give
the logits transformers gives on the dequantized weights (fp32). The checkpoints are
built by ``moe_quant_checkpoints`` in the libraries' layouts from tiny Mixtral and
Qwen3-MoE models (Qwen3-MoE's first layer is a dense MLP, quantized too)."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from moe_quant_checkpoints import FORMATS, write_online_fp8_reference, write_quantized_moe
from paged_harness import PagedBatcher
from tamis.engine.attention.metadata import forward_context
from tamis.engine.loader import kv_cache_spec, load_model
from test_models import ATOL, engine_config, prompt_ids, reference_logits

torch.set_num_threads(1)
CASES = [("mixtral", fmt) for fmt in FORMATS] + [
    ("qwen3_moe", fmt) for fmt in ("awq", "gptq-act-order", "ct-w4a16", "fp8-static")]


@pytest.fixture(scope="module")
def quantized(tiny_checkpoint, tmp_path_factory):
    """(arch, fmt) -> (quantized folder, dequantized folder), built once."""
    built = {}

    def get(arch: str, fmt: str):
        if (arch, fmt) not in built:
            out = tmp_path_factory.mktemp(f"{arch}-{fmt}")
            built[arch, fmt] = write_quantized_moe(tiny_checkpoint(arch), out, fmt)
        return built[arch, fmt]
    return get


def _logits(model, hf_config, ids: list[int], block_size: int = 4) -> torch.Tensor:
    batcher = PagedBatcher(kv_cache_spec(hf_config), num_blocks=64, block_size=block_size)
    return batcher.run(model, [("a", ids)])["a"]


def _experts(model):
    return [m for name, m in model.named_modules() if name.endswith(".experts")]


@pytest.mark.parametrize("arch,fmt", CASES)
def test_quantized_experts_match_transformers_on_the_dequantized_weights(quantized, arch, fmt):
    folder, reference = quantized(arch, fmt)
    model, hf_config = load_model(engine_config(folder), "cpu")
    ids = prompt_ids(folder, 40)
    (expected,) = reference_logits(reference, ids)
    torch.testing.assert_close(_logits(model, hf_config, ids), expected, atol=ATOL, rtol=0)


@pytest.mark.parametrize("fmt", ["awq", "gptq-act-order", "ct-w4a16"])
def test_int4_experts_stay_packed(quantized, fmt):
    """Serving memory: each expert weight is 4 bits in int32 words, no float copy."""
    model, _ = load_model(engine_config(quantized("mixtral", fmt)[0]), "cpu")
    for experts in _experts(model):
        params = dict(experts.named_parameters())
        assert params["w13_wna16_qweight"].dtype == torch.int32
        assert params["w13_wna16_qweight"].shape == (4, 64 // 8, 64)   # [E, H/8, 2I]
        assert params["w2_wna16_qweight"].shape == (4, 32 // 8, 64)    # [E, I/8, H]
        floats = [n for n, p in params.items() if p.is_floating_point() and p.dim() == 3
                  and p.shape[1:] in ((64, 64), (64, 32))]
        assert floats == [], floats
        assert ("w13_wna16_g_idx" in params) == (fmt == "gptq-act-order")


def test_fp8_experts_stay_fp8_and_static_scales_collapse_to_their_maximum(quantized):
    from safetensors import safe_open
    folder = quantized("mixtral", "fp8-static")[0]
    model, _ = load_model(engine_config(folder), "cpu")
    experts = _experts(model)[0]
    assert experts.w13_weight.dtype == torch.float8_e4m3fn
    assert experts.w13_weight_scale.shape == (4, 64)
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        prefix = "model.layers.0.block_sparse_moe.experts"
        w13 = [f.get_tensor(f"{prefix}.{e}.{p}.input_scale")
               for e in range(4) for p in ("w1", "w3")]
        w2 = [f.get_tensor(f"{prefix}.{e}.w2.input_scale") for e in range(4)]
    assert len(set(t.item() for t in w13)) == 8
    assert experts.w13_input_scale.shape == ()
    assert experts.w13_input_scale.item() == max(t.item() for t in w13)
    assert experts.w2_input_scale.item() == max(t.item() for t in w2)


@pytest.mark.parametrize("arch", ["mixtral", "qwen3_moe"])
def test_online_fp8_quantizes_every_expert_per_channel(tiny_checkpoint, tmp_path, arch):
    source = tiny_checkpoint(arch)
    model, hf_config = load_model(engine_config(source, quantization="fp8"), "cpu")
    assert all(e.w13_weight.dtype == torch.float8_e4m3fn for e in _experts(model))
    ids = prompt_ids(source, 40)
    (expected,) = reference_logits(write_online_fp8_reference(source, tmp_path), ids)
    torch.testing.assert_close(_logits(model, hf_config, ids), expected, atol=ATOL, rtol=0)


@pytest.mark.parametrize("fmt", ["awq", "gptq-act-order", "fp8-static"])
def test_triton_experts_in_the_quantized_model(quantized, monkeypatch, fmt):
    """The path CUDA takes (int tiles dequantized in the grouped GEMM; FP8 as W8A16 here,
    the CPU having no FP8 tensor cores), interpreted on CPU tensors."""
    from tamis.kernels import fused_moe

    calls = []

    def triton_path(*args):
        calls.append(args[0].shape[0])
        return fused_moe.fused_experts_triton(*args)

    folder, reference = quantized("mixtral", fmt)
    model, hf_config = load_model(engine_config(folder), "cpu")
    monkeypatch.setattr(fused_moe, "fused_experts", triton_path)
    ids = prompt_ids(folder, 20)
    (expected,) = reference_logits(reference, ids)
    torch.testing.assert_close(_logits(model, hf_config, ids), expected, atol=ATOL, rtol=0)
    assert calls == [20, 20]


def test_greedy_tokens_through_the_engine(quantized):
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parents[1] / "quant"))
    from formats import greedy_pair
    from transformers import AutoModelForCausalLM

    folder, reference = quantized("qwen3_moe", "awq")
    ref = AutoModelForCausalLM.from_pretrained(reference, dtype=torch.float32).eval()
    prompts = [prompt_ids(folder, n, offset=3 * n) for n in (1, 9, 30)]
    ours, theirs = greedy_pair(folder, ref, prompts)
    assert ours == theirs


# ----------------------------------------------------------------- dummy weights, refusals

def _load_with(tmp_path, tiny_checkpoint, quantization_config, load_format="dummy"):
    config = json.loads((tiny_checkpoint("mixtral") / "config.json").read_text())
    config["quantization_config"] = quantization_config
    (tmp_path / "config.json").write_text(json.dumps(config))
    engine_config_ = SimpleNamespace(model=str(tmp_path), dtype="float32",
                                     load_format=load_format, quantization=None, seed=0,
                                     attention_backend="torch")
    return load_model(engine_config_, "cpu")[0]


@pytest.mark.parametrize("fmt", FORMATS)
def test_dummy_quantized_moe_loads_and_runs(tmp_path, tiny_checkpoint, fmt):
    """load_format="dummy" (benchmarks at real shapes) builds every expert format."""
    from moe_quant_checkpoints import CONFIGS
    model = _load_with(tmp_path, tiny_checkpoint, CONFIGS[fmt])
    with forward_context(None, []):
        hidden = model(torch.arange(6), torch.arange(6))
    assert hidden.shape == (6, 64) and torch.isfinite(hidden).all()


@pytest.mark.parametrize("quantization_config,match", [
    ({"quant_method": "fp8", "weight_block_size": [128, 128],
      "ignored_layers": ["re:.*self_attn.*"]},     # the tiny attention is not 128-blocked
     r"experts: fp8 experts quantized as Fp8BlockLinearMethod have no mixture-of-experts"),
    ({"quant_method": "compressed-tensors", "format": "int-quantized",
      "config_groups": {"g": {"targets": ["Linear"],
                              "weights": {"type": "int", "num_bits": 8, "strategy": "channel",
                                          "symmetric": True},
                              "input_activations": {"type": "int", "num_bits": 8,
                                                    "strategy": "token", "dynamic": True,
                                                    "symmetric": True}}}},
     r"experts: compressed-tensors experts quantized as Int8W8A8LinearMethod"),
])
def test_expert_formats_without_a_kernel_are_refused_by_name(tmp_path, tiny_checkpoint,
                                                            quantization_config, match):
    with pytest.raises(ValueError, match=match):
        _load_with(tmp_path, tiny_checkpoint, quantization_config)


def test_gate_and_up_with_different_act_orders_are_refused(quantized, tmp_path):
    from safetensors.torch import load_file, save_file
    folder, _ = quantized("mixtral", "gptq-act-order")
    tensors = load_file(str(folder / "model.safetensors"))
    name = "model.layers.0.block_sparse_moe.experts.1.w3.g_idx"
    tensors[name] = tensors[name].flip(0).contiguous()
    for file in folder.iterdir():
        if file.name != "model.safetensors":
            (tmp_path / file.name).write_bytes(file.read_bytes())
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"gate and up projections of expert \[1\] have different "
                                         "g_idx"):
        load_model(engine_config(tmp_path), "cpu")


def test_a_missing_quantized_expert_tensor_is_named(quantized, tmp_path):
    from safetensors.torch import load_file, save_file
    folder, _ = quantized("mixtral", "awq")
    tensors = load_file(str(folder / "model.safetensors"))
    del tensors["model.layers.1.block_sparse_moe.experts.2.w2.qzeros"]
    for file in folder.iterdir():
        if file.name != "model.safetensors":
            (tmp_path / file.name).write_bytes(file.read_bytes())
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"missing tensor\(s\) "
                                         r"'model.layers.1.block_sparse_moe.experts.2.w2.qzeros'"):
        load_model(engine_config(tmp_path), "cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("fmt", ["awq", "gptq-act-order", "ct-w4a16", "fp8-static", "ct-fp8"])
def test_cuda_quantized_experts_pick_transformers_tokens(quantized, fmt):
    """bf16 on CUDA: the compiled kernels (int tiles dequantized in the grouped GEMMs; FP8
    as W8A8 on GPUs with FP8 tensor cores) agree with transformers' argmax on the
    dequantized weights."""
    folder, reference = quantized("mixtral", fmt)
    model, hf_config = load_model(engine_config(folder, dtype="bfloat16"), "cuda")
    batcher = PagedBatcher(kv_cache_spec(hf_config), num_blocks=32, block_size=16,
                           dtype=model.dtype, device="cuda")
    ids = prompt_ids(folder, 40)
    (expected,) = reference_logits(reference, ids)
    got = batcher.run(model, [("a", ids)])["a"].float().cpu()
    assert (got.argmax(-1) == expected.argmax(-1)).float().mean().item() >= 0.9
