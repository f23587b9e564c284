"""`tamis quantize` round trips: quantize a tiny random Llama, reload the written checkpoint
in tamis, and check (1) every dequantized weight equals the quantizer's own and (2) tamis's
logits match transformers running the dequantized fp32 model."""
from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
import torch

from tamis.engine.attention.metadata import forward_context
from tamis.engine.loader import load_model
from tamis.quant.quantizer.pipeline import QuantizeOptions, quantize_checkpoint
from tamis.quant.wna16_kernels import dequantized_weight

torch.set_num_threads(1)  # tiny shapes: a second thread only adds sync waits
CALIBRATION = ("Quantization maps each weight to a small integer grid; GPTQ corrects the "
               "rounding error of one column with the columns that remain, AWQ scales the "
               "channels that carry large activations before rounding. ") * 12
SHAPES = dict(hidden_size=128, intermediate_size=256, head_dim=32)  # K = 128 or 256
PROMPT = list(range(300, 340))
FUSED = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
         "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}


@pytest.fixture(scope="module")
def tiny(tiny_checkpoint):
    return tiny_checkpoint("llama", **SHAPES)


@pytest.fixture(scope="module")
def one_layer(tiny_checkpoint):
    return tiny_checkpoint("llama", num_hidden_layers=1, **SHAPES)


@pytest.fixture(scope="module")
def samples(tiny):
    from transformers import AutoTokenizer
    ids = AutoTokenizer.from_pretrained(tiny)(CALIBRATION, return_tensors="pt")["input_ids"][0]
    return [ids[:32], ids[32:64]]


def _tamis_model(path):
    config = SimpleNamespace(model=str(path), dtype="float32", load_format="auto",
                             quantization=None, seed=0, attention_backend="torch")
    model, _ = load_model(config, "cpu")
    return model


@torch.no_grad()
def _tamis_logits(model, ids):
    tokens = torch.tensor(ids)
    with forward_context(None, []):
        return model.compute_logits(model(tokens, torch.arange(len(ids))))


def _tamis_weight(model, name: str) -> torch.Tensor:
    """The dequantized [N, K] weight of checkpoint linear ``name`` inside tamis's model."""
    parent, _, leaf = name.rpartition(".")
    fused, shard = FUSED.get(leaf, (leaf, None))
    layer = model.get_submodule(f"{parent}.{fused}")
    if hasattr(layer, "wna16_qweight"):
        weight = dequantized_weight(layer)
    else:
        weight = layer.weight.float() * layer.weight_scale.float()[:, None]
    if shard is None:
        return weight
    offset = sum(layer.output_partition_sizes[:shard])
    return weight[offset:offset + layer.output_partition_sizes[shard]]


def _round_trip(tiny, tmp_path, options: QuantizeOptions, samples=None, layers: int = 2,
                atol: float = 2e-4):
    result = quantize_checkpoint(tiny, tmp_path / "out", options, progress=False, samples=samples)
    assert len(result.weights) == 7 * layers
    model = _tamis_model(tmp_path / "out")
    for name, quantized in result.weights.items():
        assert torch.equal(_tamis_weight(model, name), quantized.dequantize()), name
    with torch.no_grad():
        reference = result.reference_model(torch.tensor([PROMPT])).logits[0]
    torch.testing.assert_close(_tamis_logits(model, PROMPT), reference, atol=atol, rtol=0)
    return result


GPTQ_CASES = [c for c in itertools.product((4, 8), (-1, 32, 64, 128), (False, True), (True, False))]


@pytest.mark.parametrize("bits,group_size,desc_act,sym", GPTQ_CASES)
def test_gptq_round_trip(one_layer, samples, tmp_path, bits, group_size, desc_act, sym):
    options = QuantizeOptions("gptq", bits=bits, group_size=group_size, desc_act=desc_act, sym=sym)
    result = _round_trip(one_layer, tmp_path, options, samples, layers=1)
    g_idx = result.weights["model.layers.0.mlp.down_proj"].g_idx
    natural = torch.arange(256) // (256 if group_size == -1 else group_size)
    assert torch.equal(g_idx.long(), natural) != desc_act or group_size == -1


@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_awq_round_trip(tiny, samples, tmp_path, group_size):
    _round_trip(tiny, tmp_path, QuantizeOptions("awq", group_size=group_size), samples)


@pytest.mark.parametrize("bits,sym", [(4, True), (4, False), (8, True)])
def test_rtn_round_trip(tiny, tmp_path, bits, sym):
    _round_trip(tiny, tmp_path, QuantizeOptions("gptq", bits=bits, group_size=64, sym=sym, rtn=True))


@pytest.mark.parametrize("rtn", [False, True])
def test_fp8_round_trip(tiny, samples, tmp_path, rtn):
    _round_trip(tiny, tmp_path, QuantizeOptions("fp8", rtn=rtn), samples)


@pytest.mark.parametrize("arch,method", [("llama", "gptq"), ("qwen2", "gptq"), ("llama", "awq")])
def test_rotated_round_trip(tiny_checkpoint, samples, tmp_path, arch, method):
    """--rotate: the written checkpoint (norm weights of ones, embeddings untied, the
    tied Qwen2 included) reloads in tamis with the quantizer's weights and the rotated
    reference's logits; its logit error against the original model is of the order of
    the unrotated checkpoint's."""
    import json

    from transformers import AutoModelForCausalLM
    source = tiny_checkpoint(arch, **SHAPES)
    rotated = _round_trip(source, tmp_path, QuantizeOptions(method, group_size=64, rotate=True),
                          samples)
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["tie_word_embeddings"] is False
    plain = quantize_checkpoint(source, tmp_path / "plain",
                                QuantizeOptions(method, group_size=64, rotate=False), False,
                                samples)
    original = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
    with torch.no_grad():
        expected = original(torch.tensor([PROMPT])).logits[0]
        errors = [(r.reference_model(torch.tensor([PROMPT])).logits[0] - expected).pow(2).mean()
                  for r in (rotated, plain)]
    assert 0 < errors[0] < 2 * errors[1], errors


@pytest.mark.parametrize("source_dtype,written", [("float16", "F16"), ("float32", "BF16")])
def test_unquantized_tensors_are_written_in_16_bits(tiny, samples, tmp_path, source_dtype,
                                                    written):
    """The quantizer works in float32, but the tensors it does not quantize are written in
    the source's dtype when it is 16-bit, else bf16: a model rotated by default (embedding
    and head untied) keeps both, and its norms, in 16 bits, config.json says which, and
    the reload still equals the reference."""
    import json
    import shutil

    from safetensors import safe_open
    from safetensors.torch import load_file, save_file
    source = tmp_path / "bf16"
    shutil.copytree(tiny, source)
    state = load_file(str(source / "model.safetensors"))
    dtype = getattr(torch, source_dtype)
    save_file({k: v.to(dtype) for k, v in state.items()}, str(source / "model.safetensors"))
    config = json.loads((source / "config.json").read_text())
    (source / "config.json").write_text(json.dumps({**config, "dtype": source_dtype}))
    _round_trip(source, tmp_path, QuantizeOptions("gptq", group_size=64), samples)
    with safe_open(str(tmp_path / "out" / "model.safetensors"), framework="pt") as handle:
        dtypes = {name: handle.get_slice(name).get_dtype() for name in handle.keys()}
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["tie_word_embeddings"] is False
    assert config["dtype"] == {"F16": "float16", "BF16": "bfloat16"}[written]
    for name in ("model.embed_tokens.weight", "lm_head.weight", "model.norm.weight",
                 "model.layers.0.input_layernorm.weight"):
        assert dtypes[name] == written, (name, dtypes[name])
    assert dtypes["model.layers.0.mlp.down_proj.scales"] == "F16"


def test_default_rotation_skips_an_architecture_it_does_not_know(tiny, samples, tmp_path,
                                                                 monkeypatch, capsys):
    """GPTQ rotates by default only the architectures rotate.py knows (here llama taken
    off that list): elsewhere it quantizes the original weights, saying so; an asked-for
    --rotate is refused there instead."""
    from transformers import AutoModelForCausalLM

    from tamis.quant.quantizer import rotate
    monkeypatch.setattr(rotate, "SUPPORTED_MODEL_TYPES", ("mistral",))
    result = quantize_checkpoint(tiny, tmp_path / "d", QuantizeOptions("gptq", group_size=64),
                                 False, samples)
    assert "not rotating a 'llama' model" in capsys.readouterr().err
    original = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)
    assert torch.equal(result.reference_model.model.embed_tokens.weight,  # not rotated
                       original.model.embed_tokens.weight.bfloat16().float())  # as written
    with pytest.raises(ValueError, match="quantize with --no-rotate"):
        quantize_checkpoint(tiny, tmp_path / "r", QuantizeOptions("gptq", group_size=64,
                                                                  rotate=True), False, samples)


@pytest.mark.parametrize("method,options", [("gptq", dict(bits=4, group_size=32)), ("fp8", {})])
def test_gptq_beats_round_to_nearest(one_layer, samples, tmp_path, method, options):
    """GPTQ minimizes a layer's output error on its calibration inputs: there, its
    down_proj output error must be below round-to-nearest's (integer and FP8 grids)."""
    from transformers import AutoModelForCausalLM
    options = dict(options, rotate=False)  # the original model's weights, as compared below
    gptq = quantize_checkpoint(one_layer, tmp_path / "g", QuantizeOptions(method, **options),
                               False, samples)
    rtn = quantize_checkpoint(one_layer, tmp_path / "r",
                              QuantizeOptions(method, rtn=True, **options), False)
    original = AutoModelForCausalLM.from_pretrained(one_layer, dtype=torch.float32)
    down = original.model.layers[0].mlp.down_proj
    seen = []
    handle = down.register_forward_hook(lambda _m, args, _o: seen.append(args[0][0]))
    with torch.no_grad():
        for ids in samples:
            original(ids[None])
    handle.remove()
    x = torch.cat(seen)
    name = "model.layers.0.mlp.down_proj"
    errors = {k: (x @ (r.weights[name].dequantize() - down.weight).t()).pow(2).mean().item()
              for k, r in (("gptq", gptq), ("rtn", rtn))}
    assert errors["gptq"] < 0.9 * errors["rtn"], errors


def test_cli_writes_a_loadable_checkpoint(tiny, tmp_path):
    from tamis.cli import main
    text = tmp_path / "calib.txt"
    text.write_text(CALIBRATION)
    code = main(["quantize", str(tiny), "--method", "gptq", "--bits", "4", "--group-size", "64",
                 "--desc-act", "--calibration-text", str(text), "--num-samples", "2",
                 "--seq-len", "32", "--output", str(tmp_path / "cli")])
    assert code == 0
    model = _tamis_model(tmp_path / "cli")
    assert torch.isfinite(_tamis_logits(model, PROMPT[:8])).all()


@pytest.mark.parametrize("argv,message", [
    (["--method", "awq", "--bits", "8"], "--bits 8 is not supported for awq"),
    (["--method", "gptq", "--group-size", "48"], "--group-size 48 is not supported"),
    (["--method", "awq", "--sym"], "AWQ's GEMM format stores zero points"),
    (["--method", "fp8", "--desc-act"], "--desc-act needs --method gptq"),
    (["--method", "fp8", "--format", "native"], "--method fp8 writes the compressed-tensors"),
    (["--method", "gptq", "--desc-act", "--format", "compressed-tensors"],
     "needs --static-groups"),
])
def test_cli_rejects_bad_options(tiny, tmp_path, capsys, argv, message):
    from tamis.cli import main
    assert main(["quantize", str(tiny), *argv, "--output", str(tmp_path / "x")]) == 2
    assert message in capsys.readouterr().err


def test_awq_rejects_group_not_dividing_k(tiny_checkpoint, tmp_path):
    odd = tiny_checkpoint("llama", hidden_size=96, intermediate_size=192, head_dim=24)
    with pytest.raises(ValueError, match=r"model.layers.0.self_attn.q_proj: AWQ needs K "
                                         r"divisible by the group size"):
        quantize_checkpoint(odd, tmp_path / "x", QuantizeOptions("awq", group_size=64), False)
