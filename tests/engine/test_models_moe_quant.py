"""Quantized mixture-of-experts checkpoints (AWQ, GPTQ, compressed-tensors W4A16, FP8 and
INT8 W8A8, serialized FP8 per tensor and in 128x128 blocks, online FP8) load into tamis
with their experts kept quantized and give the logits transformers gives on the
dequantized weights (fp32; for INT8 W8A8 with every quantized linear's input
fake-quantized per token, the W8A8 math). The checkpoints are
built by ``moe_quant_checkpoints`` in the libraries' layouts from tiny Mixtral and
Qwen3-MoE models (Qwen3-MoE's first layer is a dense MLP, quantized too)."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from moe_quant_checkpoints import (FORMATS, fake_quant_fp8_per_token, fake_quant_per_token,
                                   write_online_fp8_reference, write_quantized_moe)
from paged_harness import PagedBatcher
from tamis.engine.attention.metadata import forward_context
from tamis.engine.loader import kv_cache_spec, load_model
from test_models import ATOL, engine_config, prompt_ids, reference_logits

torch.set_num_threads(1)
CASES = [("mixtral", fmt) for fmt in FORMATS] + [
    ("qwen3_moe", fmt) for fmt in ("awq", "gptq-act-order", "ct-w4a16", "fp8-static",
                                   "fp8-block", "ct-int8")]


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


def w8a8_reference_logits(path, ids: list[int], fake_quant=fake_quant_per_token) -> torch.Tensor:
    """transformers' logits on the dequantized weights with the input of every quantized
    linear (attention, dense MLP, each expert; not the routers or lm_head) fake-quantized
    per token (``fake_quant``): the W8A8 math in fp32 (INT8 by default)."""
    from unittest import mock

    from transformers import AutoModelForCausalLM
    ref = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                               experts_implementation="eager").eval()
    storage = {name: p.untyped_storage().data_ptr() for name, p in ref.named_parameters()}
    plain = {ptr for name, ptr in storage.items()
             if name == "lm_head.weight" or name.endswith(".gate.weight")}
    experts = {ptr for name, ptr in storage.items() if ".experts." in name}
    fake_quantized = set()
    linear = torch.nn.functional.linear

    def w8a8_linear(x, weight, bias=None):
        if weight.untyped_storage().data_ptr() not in plain:
            fake_quantized.add(weight.untyped_storage().data_ptr())
            x = fake_quant(x)
        return linear(x, weight, bias)

    with mock.patch.object(torch.nn.functional, "linear", w8a8_linear), torch.no_grad():
        logits = ref(torch.tensor([ids])).logits[0].float()
    assert experts <= fake_quantized, "transformers ran its experts without F.linear"
    return logits


def expected_logits(reference, fmt: str, ids: list[int]) -> torch.Tensor:
    if fmt == "ct-int8":
        return w8a8_reference_logits(reference, ids)
    (expected,) = reference_logits(reference, ids)
    return expected


@pytest.mark.parametrize("arch,fmt", CASES)
def test_quantized_experts_match_transformers_on_the_dequantized_weights(quantized, arch, fmt):
    folder, reference = quantized(arch, fmt)
    model, hf_config = load_model(engine_config(folder), "cpu")
    ids = prompt_ids(folder, 40)
    expected = expected_logits(reference, fmt, ids)
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


def test_block_fp8_experts_keep_a_partial_block_per_projection(tiny_checkpoint, tmp_path):
    """I = 160: gate and up each end in a partial block of 32 rows, and H = 64 is one
    partial block along K; the scale rows stay per projection, as the checkpoint's are."""
    source = tiny_checkpoint("mixtral", intermediate_size=160)
    folder, reference = write_quantized_moe(source, tmp_path, "fp8-block")
    model, hf_config = load_model(engine_config(folder), "cpu")
    experts = _experts(model)[0]
    assert experts.w13_weight.dtype == experts.w2_weight.dtype == torch.float8_e4m3fn
    assert experts.w13_weight_scale_inv.shape == (4, 4, 1)   # [E, 2 * ceil(160/128), 1]
    assert experts.w2_weight_scale_inv.shape == (4, 1, 2)    # [E, 1, ceil(160/128)]
    ids = prompt_ids(folder, 30)
    (expected,) = reference_logits(reference, ids)
    torch.testing.assert_close(_logits(model, hf_config, ids), expected, atol=ATOL, rtol=0)


def test_int8_experts_stay_int8(quantized):
    model, _ = load_model(engine_config(quantized("mixtral", "ct-int8")[0]), "cpu")
    for experts in _experts(model):
        assert experts.w13_weight.dtype == experts.w2_weight.dtype == torch.int8
        assert experts.w13_weight.shape == (4, 64, 64) and experts.w2_weight.shape == (4, 64, 32)
        assert experts.w13_weight_scale.shape == (4, 64)
        assert experts.w2_weight_scale.shape == (4, 64)


@pytest.mark.parametrize("arch", ["mixtral", "qwen3_moe"])
def test_online_fp8_quantizes_every_expert_per_channel(tiny_checkpoint, tmp_path, arch):
    source = tiny_checkpoint(arch)
    model, hf_config = load_model(engine_config(source, quantization="fp8"), "cpu")
    assert all(e.w13_weight.dtype == torch.float8_e4m3fn for e in _experts(model))
    ids = prompt_ids(source, 40)
    (expected,) = reference_logits(write_online_fp8_reference(source, tmp_path), ids)
    torch.testing.assert_close(_logits(model, hf_config, ids), expected, atol=ATOL, rtol=0)


@pytest.mark.parametrize("fmt", ["awq", "gptq-act-order", "fp8-static", "fp8-block", "ct-int8"])
def test_triton_experts_in_the_quantized_model(quantized, monkeypatch, fmt):
    """The path CUDA takes (int tiles dequantized in the grouped GEMM; FP8 as W8A16 here,
    the CPU having no FP8 tensor cores; INT8 as W8A8), interpreted on CPU tensors."""
    from tamis.kernels import fused_moe

    calls = []

    def triton_path(*args):
        calls.append(args[0].shape[0])
        return fused_moe.fused_experts_triton(*args)

    folder, reference = quantized("mixtral", fmt)
    model, hf_config = load_model(engine_config(folder), "cpu")
    monkeypatch.setattr(fused_moe, "fused_experts", triton_path)
    ids = prompt_ids(folder, 20)
    expected = expected_logits(reference, fmt, ids)
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


def test_an_expert_format_without_a_kernel_is_refused_by_name():
    """A linear method with no expert counterpart (a format added for dense layers only)."""
    from tamis.engine.layers.quant_method import LinearMethodBase
    from tamis.quant.moe import get_moe_method

    class DenseOnlyMethod(LinearMethodBase):
        def create_weights(self, layer, input_size, output_partition_sizes, params_dtype):
            raise AssertionError("experts never create dense weights")

        def apply(self, layer, x, bias=None):
            raise AssertionError("experts never run a dense apply")

    config = SimpleNamespace(get_linear_method=lambda prefix: DenseOnlyMethod(),
                             get_name=lambda: "dense-only")
    with pytest.raises(ValueError, match=r"model.layers.3.mlp.experts: dense-only experts "
                                         r"quantized as DenseOnlyMethod have no mixture-of-"
                                         r"experts kernel"):
        get_moe_method(config, "model.layers.3.mlp.experts")


def _tensors(folder) -> dict:
    from safetensors.torch import load_file
    return load_file(str(folder / "model.safetensors"))


def _save_copy(folder, tensors: dict, target) -> None:
    """``folder``'s checkpoint in ``target`` with ``tensors`` as its weights (a broken copy)."""
    from safetensors.torch import save_file
    for file in folder.iterdir():
        if file.name != "model.safetensors":
            (target / file.name).write_bytes(file.read_bytes())
    save_file(tensors, str(target / "model.safetensors"))


def test_block_scales_of_the_wrong_shape_are_refused_by_name(quantized, tmp_path):
    """An expert's weight_scale_inv must be its own projection's [ceil(N/128), ceil(K/128)]."""
    folder, _ = quantized("mixtral", "fp8-block")
    tensors = _tensors(folder)
    tensors["model.layers.1.block_sparse_moe.experts.2.w3.weight_scale_inv"] = torch.ones(2, 1)
    _save_copy(folder, tensors, tmp_path)
    with pytest.raises(ValueError, match=r"model.layers.1.block_sparse_moe.experts: checkpoint "
                                         r"tensor has shape \(2, 1\)"):
        load_model(engine_config(tmp_path), "cpu")


def test_gate_and_up_with_different_act_orders_are_refused(quantized, tmp_path):
    folder, _ = quantized("mixtral", "gptq-act-order")
    tensors = _tensors(folder)
    name = "model.layers.0.block_sparse_moe.experts.1.w3.g_idx"
    tensors[name] = tensors[name].flip(0).contiguous()
    _save_copy(folder, tensors, tmp_path)
    with pytest.raises(ValueError, match=r"gate and up projections of expert \[1\] have different "
                                         "g_idx"):
        load_model(engine_config(tmp_path), "cpu")


def test_a_missing_quantized_expert_tensor_is_named(quantized, tmp_path):
    folder, _ = quantized("mixtral", "awq")
    tensors = _tensors(folder)
    del tensors["model.layers.1.block_sparse_moe.experts.2.w2.qzeros"]
    _save_copy(folder, tensors, tmp_path)
    with pytest.raises(ValueError, match=r"missing tensor\(s\) "
                                         r"'model.layers.1.block_sparse_moe.experts.2.w2.qzeros'"):
        load_model(engine_config(tmp_path), "cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("fmt", ["awq", "gptq-act-order", "ct-w4a16", "fp8-static", "ct-fp8",
                                 "fp8-block", "ct-int8"])
def test_cuda_quantized_experts_pick_transformers_tokens(quantized, fmt):
    """bf16 on CUDA: the compiled kernels (int tiles dequantized in the grouped GEMMs; FP8
    and block FP8 as W8A8 on GPUs with FP8 tensor cores; INT8 as W8A8) agree with
    transformers' argmax on the dequantized weights (INT8: W8A8 math)."""
    folder, reference = quantized("mixtral", fmt)
    model, hf_config = load_model(engine_config(folder, dtype="bfloat16"), "cuda")
    batcher = PagedBatcher(kv_cache_spec(hf_config), num_blocks=32, block_size=16,
                           dtype=model.dtype, device="cuda")
    ids = prompt_ids(folder, 40)
    got = batcher.run(model, [("a", ids)])["a"].float().cpu()
    if fmt == "ct-fp8":   # dynamic per-token FP8 activations on the GPU (W8A8)
        expected = w8a8_reference_logits(reference, ids, fake_quant_fp8_per_token)
    else:
        expected = expected_logits(reference, fmt, ids)
    agree = (got.argmax(-1) == expected.argmax(-1)).sum().item()
    if fmt in ("ct-fp8", "fp8-static"):
        # FP8 activations (per token, or on the static input scale): rounding to e4m3 moves
        # an activation by up to 1/16, and bf16 inputs round differently from the fp32
        # reference's, so argmax on this random model's near-tied logits is noisy. On an
        # H100: ct-fp8 32/40 agreed, fp8-static 36/40, mean logit errors 0.038 / 0.040
        # against a logit spread of 0.8; the fp32 references with and without activation
        # rounding agree on only 32-35/40 themselves. A wrong scale or layout would move
        # the logits by about the spread.
        assert (got - expected).abs().mean().item() <= 0.06
        assert agree >= 0.7 * len(ids)
    else:
        assert agree >= 0.9 * len(ids)   # fp8-block 38/40 on an H100
