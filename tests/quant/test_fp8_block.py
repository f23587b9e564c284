"""Block-wise FP8 (DeepSeek-V3 / Qwen3-FP8: ``weight_block_size`` [128, 128],
``weight_scale_inv``): the activation quantizer and matmul reference against the format's
formula, the Triton kernel against the reference (interpreted on CPU, compiled on a GPU),
the layer loader including partial blocks, and a tiny checkpoint's logits against
transformers loading the same files.

transformers runs these checkpoints on a CPU by dequantizing each weight block by block
(``FineGrainedFP8Config.dequantize``), and so does tamis's CPU path: the model check
compares like with like. The W8A8 math (activations quantized per token group) is what
the GPU kernel runs, checked against ``w8a8_block_fp8_matmul_ref``.
"""
from __future__ import annotations


import pytest
import torch

from formats import (greedy_pair, load_layer, make_layer, quantize_block_fp8,
                     write_quantized_checkpoint)
from tamis.kernels.fp8_block import (dequantize_block_fp8, per_token_group_quant_fp8,
                                     per_token_group_quant_fp8_ref,
                                     per_token_group_quant_fp8_triton,
                                     w8a8_block_fp8_matmul_ref, w8a8_block_fp8_matmul_triton)
from tamis.quant import get_quant_config
from tamis.quant.fp8_block import Fp8BlockConfig
from test_roundtrip import FUSED, PROMPT, _tamis_logits, _tamis_model

torch.set_num_threads(1)  # tiny shapes: a second thread only adds sync waits
BLOCK = (128, 128)
CONFIG = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
          "weight_block_size": [128, 128], "modules_to_not_convert": ["lm_head"]}
# q, k and v of 128 rows each: fused shards must fill whole 128-row blocks.
MODEL = dict(hidden_size=128, intermediate_size=256, head_dim=32, num_attention_heads=4,
             num_key_value_heads=4)


def _random_fp8_weight(n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    weight = torch.randn(n, k) * torch.rand(n, 1) * 0.1
    return quantize_block_fp8(weight, BLOCK[0])


# ------------------------------------------------------------------ math

@pytest.mark.parametrize("k", [128, 200, 384])
def test_group_quant_scales_each_group_of_128(k):
    x = torch.randn(6, k) * torch.linspace(0.1, 10, k)
    x[2, :128] = 0.0                                    # an all-zero group stays finite
    codes, scales = per_token_group_quant_fp8_ref(x, 128)
    assert codes.shape == (6, k) and scales.shape == (6, -(-k // 128))
    for g in range(scales.shape[1]):
        group = x[:, g * 128:(g + 1) * 128]
        amax = group.abs().amax(dim=1).clamp(min=1e-10)
        torch.testing.assert_close(scales[:, g], amax / 448.0, rtol=0, atol=0)
        dequant = codes[:, g * 128:(g + 1) * 128].float() * scales[:, g:g + 1]
        # e4m3 keeps 3 mantissa bits: relative error at most 2**-4, and at most half
        # the subnormal step 2**-9 of the scale below e4m3's normal range.
        bound = group.abs() / 16 + scales[:, g:g + 1] * 2.0**-10
        assert ((dequant - group).abs() <= bound).all()
    assert codes[:, :].float().abs().max() <= 448.0


@pytest.mark.parametrize("m,k", [(1, 128), (6, 200), (3, 384)])
def test_triton_group_quant_matches_reference(m, k):
    """Interpreted on CPU: the same scales, and the same float8 codes bit for bit, both
    as the kernel encodes them and as torch rounds its fp32 quotients."""
    x = torch.randn(m, k) * torch.linspace(0.1, 10, k)
    x[0, :128] = 0.0
    x[-1, -5:] = torch.tensor([1e-6, -3e-5, 2.0**-12, 126.4, -124.5])  # subnormals, binade edges
    ref_codes, ref_scales = per_token_group_quant_fp8_ref(x, 128)
    quotients, scales = per_token_group_quant_fp8_triton(x, 128, codes_dtype=torch.float32)
    assert torch.equal(scales, ref_scales)
    rounded = quotients.to(torch.float8_e4m3fn)
    assert torch.equal(rounded.view(torch.uint8), ref_codes.view(torch.uint8))
    codes, scales = per_token_group_quant_fp8_triton(x, 128)
    assert torch.equal(scales, ref_scales)
    assert torch.equal(codes.view(torch.uint8), ref_codes.view(torch.uint8))


def test_matmul_reference_is_the_dequantized_product():
    m, n, k = 5, 160, 200                               # partial blocks along N and K
    weight, scale_inv = _random_fp8_weight(n, k)
    x = torch.randn(m, k)
    x_q, x_scale = per_token_group_quant_fp8(x, 128)
    x_dense = x_q.double() * x_scale.double().repeat_interleave(128, dim=1)[:, :k]
    expected = x_dense @ dequantize_block_fp8(weight, scale_inv, BLOCK, torch.float64).t()
    out = w8a8_block_fp8_matmul_ref(x_q, x_scale, weight, scale_inv, BLOCK, torch.float32)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)


def test_dequantize_matches_the_format_per_block():
    weight, scale_inv = _random_fp8_weight(160, 200)
    dense = dequantize_block_fp8(weight, scale_inv, BLOCK, torch.float32)
    for i in range(2):
        for j in range(2):
            rows, cols = slice(i * 128, (i + 1) * 128), slice(j * 128, (j + 1) * 128)
            assert torch.equal(dense[rows, cols], weight[rows, cols].float() * scale_inv[i, j])


# ------------------------------------------------------------------ Triton kernel

@pytest.mark.parametrize("m,n,k", [(1, 128, 128), (5, 160, 200), (33, 256, 256)])
@pytest.mark.parametrize("codes_dtype", [torch.float8_e4m3fn, torch.float32])
def test_triton_kernel_matches_reference(m, n, k, codes_dtype):
    """Interpreted on CPU: float8 codes, and the same codes held in fp32 (exact)."""
    weight, scale_inv = _random_fp8_weight(n, k)
    x_q, x_scale = per_token_group_quant_fp8(torch.randn(m, k), 128)
    expected = w8a8_block_fp8_matmul_ref(x_q, x_scale, weight, scale_inv, BLOCK, torch.float32)
    out = w8a8_block_fp8_matmul_triton(x_q.to(codes_dtype), x_scale, weight.to(codes_dtype),
                                       scale_inv, BLOCK, torch.float32)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("m", [1, 64, 256])
def test_triton_kernel_on_gpu_at_llama_shapes(m):
    from tamis.kernels.fp8 import fp8_supported
    from tamis.kernels.fp8_block import block_fp8_linear
    if not fp8_supported("cuda"):
        pytest.skip("needs a GPU with FP8 tensor cores (compute capability >= 8.9)")
    n, k = 4096, 4096
    weight, scale_inv = _random_fp8_weight(n, k)
    weight, scale_inv = weight.cuda(), scale_inv.cuda()
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    x_q, x_scale = per_token_group_quant_fp8_ref(x, 128)
    codes, scales = per_token_group_quant_fp8(x, 128)          # the Triton quantizer
    assert torch.equal(scales, x_scale)
    assert torch.equal(codes.view(torch.uint8), x_q.view(torch.uint8))
    expected = w8a8_block_fp8_matmul_ref(x_q, x_scale, weight, scale_inv, BLOCK, torch.float32)
    out = block_fp8_linear(x, weight, scale_inv, BLOCK)
    torch.testing.assert_close(out.float(), expected, rtol=1.6e-2, atol=1e-2)


# ------------------------------------------------------------------ layer and config

def test_fused_layer_loads_block_scales_per_shard():
    shards = {"q": 128, "k": 128, "v": 128}
    layer = make_layer(Fp8BlockConfig.from_config(CONFIG), 200, list(shards.values()),
                       head_dim=32)
    tensors, expected = {}, []
    for shard, n in shards.items():
        weight, scale_inv = _random_fp8_weight(n, 200)
        tensors.update({("weight", shard): weight, ("weight_scale_inv", shard): scale_inv})
        expected.append(weight.float() * scale_inv.repeat_interleave(128, 1)[:, :200])
    load_layer(layer, tensors)
    expected = torch.cat(expected)
    x = torch.randn(4, 200)
    torch.testing.assert_close(layer(x), x @ expected.t(), rtol=1e-5, atol=1e-5)


def test_single_layer_may_end_in_partial_blocks():
    layer = make_layer(Fp8BlockConfig.from_config(CONFIG), 200, [160],
                       prefix="model.layers.0.mlp.down_proj")
    weight, scale_inv = _random_fp8_weight(160, 200)
    assert scale_inv.shape == (2, 2)
    load_layer(layer, {("weight", None): weight, ("weight_scale_inv", None): scale_inv})
    x = torch.randn(3, 200)
    expected = dequantize_block_fp8(weight, scale_inv, BLOCK, torch.float32)
    torch.testing.assert_close(layer(x), x @ expected.t(), rtol=1e-5, atol=1e-5)


def test_unsupported_variants_are_refused_by_name(tmp_path):
    def detect(**overrides):
        return get_quant_config(tmp_path, {"quantization_config": {**CONFIG, **overrides}}, None)

    assert type(detect()).__name__ == "Fp8BlockConfig"
    with pytest.raises(ValueError, match=r"weight_block_size=\[128, 64\]; tamis supports"):
        detect(weight_block_size=[128, 64])
    with pytest.raises(ValueError, match=r"activation_scheme='static'; tamis supports 'dynamic'"):
        detect(activation_scheme="static")
    with pytest.raises(ValueError, match=r"qkv_proj: a fused shard of N=96 rows"):
        make_layer(detect(), 128, [128, 96, 96], head_dim=32)
    layer = make_layer(detect(), 200, [160], prefix="model.layers.0.mlp.down_proj")
    with pytest.raises(ValueError, match=r"down_proj: weight_scale_inv has shape \(1, 2\), "
                                         r"expected \(2, 2\)"):
        load_layer(layer, {("weight_scale_inv", None): torch.ones(1, 2)})


# ------------------------------------------------------------------ a tiny checkpoint

@pytest.fixture(scope="module")
def block_fp8_model(tiny_checkpoint, tmp_path_factory):
    def quantize(weight):
        codes, scale_inv = quantize_block_fp8(weight, 128)
        return {"weight": codes, "weight_scale_inv": scale_inv}
    return write_quantized_checkpoint(tiny_checkpoint("llama", **MODEL),
                                      tmp_path_factory.mktemp("block-fp8"), quantize, CONFIG)


def _tamis_block_weight(model, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes, weight_scale_inv) of checkpoint linear ``name``'s rows inside tamis's model."""
    parent, _, leaf = name.rpartition(".")
    fused, shard = FUSED.get(leaf, (leaf, None))
    layer = model.get_submodule(f"{parent}.{fused}")
    if shard is None:
        return layer.weight, layer.weight_scale_inv
    offset = sum(layer.output_partition_sizes[:shard])
    rows = layer.output_partition_sizes[shard]
    return (layer.weight[offset:offset + rows],
            layer.weight_scale_inv[offset // BLOCK[0]:(offset + rows) // BLOCK[0]])


def test_tiny_checkpoint_matches_transformers(block_fp8_model):
    """transformers on a CPU dequantizes each weight (FineGrainedFP8's dequantize mode):
    its weights equal tamis's blocks dequantized, and the logits agree."""
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(block_fp8_model, dtype=torch.float32).eval()
    assert type(reference.model.layers[0].self_attn.q_proj).__name__ in ("Linear", "FP8Linear")
    model = _tamis_model(block_fp8_model)
    assert type(model.model.layers[0].self_attn.qkv_proj.quant_method).__name__ == \
        "Fp8BlockLinearMethod"
    linears = {name: module for name, module in reference.model.layers.named_modules()
               if isinstance(module, torch.nn.Linear)}
    assert len(linears) == 14                           # 7 per layer, 2 layers
    for name, module in linears.items():
        dense = dequantize_block_fp8(*_tamis_block_weight(model, f"model.layers.{name}"),
                                     BLOCK, torch.float32)
        assert torch.equal(dense, module.weight.detach()), name
    with torch.no_grad():
        expected = reference(torch.tensor([PROMPT])).logits[0]
    logits = _tamis_logits(model, PROMPT)
    torch.testing.assert_close(logits, expected, atol=2e-4, rtol=0)
    assert torch.equal(logits.argmax(-1), expected.argmax(-1))


def test_tiny_checkpoint_greedy_tokens_match_transformers(block_fp8_model):
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(block_fp8_model, dtype=torch.float32).eval()
    prompts = [PROMPT, PROMPT[:7], list(range(1000, 1021))]
    ours, theirs = greedy_pair(block_fp8_model, reference, prompts)
    assert ours == theirs
