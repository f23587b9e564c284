"""Mixture-of-experts checkpoints that llm-compressor itself quantized load in tamis with
their experts kept quantized, dequantize to exactly what compressed-tensors decompresses,
and give the logits and greedy tokens of transformers + compressed-tensors on the same
folder.

Models: the tiny random Mixtral and Qwen3-MoE of tests/tiny_models.py (2 layers, hidden
64, 4 experts of intermediate 32, 2 per token; Qwen3-MoE's first layer is a dense MLP).
llm-compressor 0.14 (tests/quant/library_quantize.py, ``moe-*`` kinds) quantizes every
decoder linear, each expert's projections included, and keeps the routers and lm_head
dense with its own ignore idioms:

=====================  =================================================================
moe-ct-w4a16           QuantizationModifier, int4 symmetric, group 32 (pack-quantized)
moe-ct-gptq-w4a16      GPTQModifier, the same scheme, calibrated on 4 x 64 tokens
moe-ct-fp8-dynamic     FP8_DYNAMIC: per-channel FP8 weights, dynamic per-token activations
moe-ct-int8-w8a8       W8A8: per-channel int8 weights, dynamic per-token int8 activations
=====================  =================================================================

What the library writes: transformers 5 fuses each layer's experts; llm-compressor splits
them into one linear per expert and projection and saves those, so its Mixtral names the
experts' tensors ``block_sparse_moe.experts.<e>.{gate,up,down}_proj`` where Mixtral's own
checkpoints say ``w1`` / ``w3`` / ``w2``. transformers cannot read such a folder back by
itself: the reference loads it through llm-compressor's ``load_context`` (Mixtral with
``patch_moe_mappings`` declaring that layout) and lets compressed-tensors decompress it.
tamis's Mixtral reads both names (``expert_weight_aliases``).

The reference runs each prompt with the activations handled as tamis handles them on this
CPU, so logits agree to fp32 rounding (``ATOL``) and greedy tokens are equal:

- W4A16: the decompressed weights (compressed-tensors' own forward, "library").
- FP8: tamis runs FP8 weights with unquantized activations on a CPU (no FP8 tensor
  cores), so the reference is the decompressed weights with compressed-tensors'
  quantization disabled ("weights_only").
- INT8 W8A8: tamis rounds each token's activations to amax / 127 as vLLM's kernels do;
  the reference adds that rounding to "weights_only" ("int8_per_token").

compressed-tensors' own activation emulation is no reference for the last two: it scales
int8 by amax / 127.5, and on the 2-D inputs transformers' experts get its "token" strategy
reduces no dimension, so each expert's routed tokens share one scale. Against it tamis's
logits differ by up to 0.7 (FP8) and 0.45 (INT8) for logits of magnitude 4.

Not covered, because llm-compressor 0.14 cannot write them here: act-order GPTQ with a
group index (``actorder='group' has been removed``; its default, "static", keeps groups
contiguous) and AWQ (AWQModifier on Qwen3-MoE: "AWQ needs to match a single smoothlayer for
each mapping", its MoE mapping also matching the dense first layer's norm; on Mixtral:
"Cannot access accelerator device when none is available", it pins memory on CPU).

AutoAWQ 0.2.9 cannot quantize either model under transformers 5: its Mixtral class reads
``layer.block_sparse_moe`` ("'MixtralDecoderLayer' object has no attribute
'block_sparse_moe'") and its Qwen3-MoE class iterates the experts ("'Qwen3MoeExperts'
object is not iterable"), both written for the per-expert modules of transformers 4.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import torch

from formats import tamis_greedy
from libraries import LibraryUnavailable, run_library_moe
from library_quantize import MOE_GREEDY_TOKENS, MOE_PROMPTS
from test_roundtrip import _tamis_logits, _tamis_model, _tamis_weight

torch.set_num_threads(1)  # tiny shapes: a second thread only adds sync waits
pytestmark = pytest.mark.network   # the libraries' venv is built from PyPI on first use

ATOL = 1e-4
# INT8 W8A8 rounds each token's activations to steps of amax / 127: an fp32 difference of
# an ulp between two correct runs (tamis multiplies fused q/k/v and gate/up weights, the
# reference separate ones) can move one activation across a rounding boundary, a whole
# step. Once in a CI run (the library checkpoint is rebuilt each run): logits off by up to
# 0.0056 where they are ~1e-6 otherwise (logits' std ~0.8); a wrong scale is off by far more.
ATOL_INT8_ACTIVATIONS = 2e-2
# kind -> (tamis's expert method, the reference run matching tamis's activations here)
KINDS = {
    "moe-ct-w4a16": ("CompressedTensorsWNA16MoEMethod", "library"),
    "moe-ct-gptq-w4a16": ("CompressedTensorsWNA16MoEMethod", "library"),
    "moe-ct-fp8-dynamic": ("Fp8MoEMethod", "weights_only"),
    "moe-ct-int8-w8a8": ("Int8MoEMethod", "int8_per_token"),
}
# Decoder linears each checkpoint quantizes: 4 attention + 4 experts x 3 per MoE layer,
# + 3 for Qwen3-MoE's dense first layer.
QUANTIZED_LINEARS = {"mixtral": 2 * (4 + 12), "qwen3_moe": (4 + 3) + (4 + 12)}
CASES = [(arch, kind) for arch in QUANTIZED_LINEARS for kind in KINDS]
EXPERT = re.compile(r"(?P<block>.+\.experts)\.(?P<expert>\d+)\.(?P<proj>\w+)")
EXPERT_ROWS = {"gate_proj": ("w13", 0), "up_proj": ("w13", 1), "down_proj": ("w2", None)}


@pytest.fixture(scope="module")
def library_checkpoint(tiny_checkpoint, tmp_path_factory):
    """(arch, kind) -> the folder llm-compressor wrote (every kind of an arch in one
    library run, once per session)."""
    def get(arch: str, kind: str) -> Path:
        out = tmp_path_factory.getbasetemp() / f"library-moe-{arch}"
        try:
            return run_library_moe(tiny_checkpoint(arch), out) / kind
        except LibraryUnavailable as exc:
            # CI sets TAMIS_REQUIRE_QUANT_LIBS=1: there a missing library is a failure.
            if os.environ.get("TAMIS_REQUIRE_QUANT_LIBS") == "1":
                raise
            pytest.skip(f"quantization libraries unavailable (needs PyPI access once): {exc}")
    return get


def _tamis_expert_weight(model, name: str) -> torch.Tensor:
    """The dequantized [N, K] weight of checkpoint expert linear ``name`` (``...experts.<e>.
    <proj>``) from tamis's stacked experts."""
    from tamis.kernels.moe_weights import dense_expert

    match = EXPERT.fullmatch(name)
    experts = model.get_submodule(match["block"])
    stacks = dict(zip(("w13", "w2"), experts.quant_method.expert_weights(experts)))
    stack, shard = EXPERT_ROWS[match["proj"]]
    weight = dense_expert(stacks[stack], int(match["expert"]), torch.float32)
    if shard is None:
        return weight
    rows = experts.intermediate_size
    return weight[shard * rows:(shard + 1) * rows]


def _tamis_linear_weight(model, name: str) -> torch.Tensor:
    return (_tamis_expert_weight if EXPERT.fullmatch(name) else _tamis_weight)(model, name)


def _moe_blocks(model):
    return [m for name, m in model.named_modules() if name.endswith(".experts")]


@pytest.mark.parametrize("arch,block", [("mixtral", "block_sparse_moe"), ("qwen3_moe", "mlp")])
def test_library_moe_layout(arch, block, library_checkpoint):
    """What the docstring says llm-compressor writes: one packed tensor set per expert and
    projection under gate_proj / up_proj / down_proj, the routers and lm_head dense."""
    import json

    from safetensors import safe_open

    folder = library_checkpoint(arch, "moe-ct-w4a16")
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        router = f.get_tensor(f"model.layers.1.{block}.gate.weight")
    experts = {name for name in names if ".experts." in name}
    assert experts == {f"model.layers.{layer}.{block}.experts.{e}.{proj}.{tensor}"
                       for layer in ({0, 1} if arch == "mixtral" else {1}) for e in range(4)
                       for proj in ("gate_proj", "up_proj", "down_proj")
                       for tensor in ("weight_packed", "weight_scale", "weight_shape")}
    assert router.dtype == torch.float32 and router.shape == (4, 64)
    assert "lm_head.weight" in names
    config = json.loads((folder / "config.json").read_text())["quantization_config"]
    assert f"model.layers.1.{block}.gate" in config["ignore"]


@pytest.mark.parametrize("arch,kind", CASES)
def test_library_moe_checkpoint_matches_compressed_tensors(arch, kind, library_checkpoint):
    from safetensors.torch import load_file

    folder = library_checkpoint(arch, kind)
    dense = load_file(str(folder / "reference" / "dequantized.safetensors"))
    reference = torch.load(folder / "reference" / "transformers.pt")
    assert len(dense) == QUANTIZED_LINEARS[arch], sorted(dense)
    # The reference ran the library's own weights (a linear left at random init would not).
    assert all(torch.equal(reference["weights"][name.replace("block_sparse_moe", "mlp")], w)
               for name, w in dense.items())

    model = _tamis_model(folder)
    method, run = KINDS[kind]
    assert {type(m.quant_method).__name__ for m in _moe_blocks(model)} == {method}
    for name, weight in dense.items():
        assert torch.equal(_tamis_linear_weight(model, name), weight), name
    atol = ATOL_INT8_ACTIVATIONS if run == "int8_per_token" else ATOL
    for prompt, expected in zip(MOE_PROMPTS, reference[run]["logits"]):
        torch.testing.assert_close(_tamis_logits(model, prompt), expected, atol=atol, rtol=0)


@pytest.mark.parametrize("arch,kind", CASES)
def test_library_moe_checkpoint_greedy_tokens(arch, kind, library_checkpoint):
    """Through tamis's engine (paged KV, prompts batched) the greedy continuations are
    transformers + compressed-tensors' own."""
    folder = library_checkpoint(arch, kind)
    reference = torch.load(folder / "reference" / "transformers.pt")[KINDS[kind][1]]
    assert tamis_greedy(folder, MOE_PROMPTS, MOE_GREEDY_TOKENS) == reference["greedy"]
