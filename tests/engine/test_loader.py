"""Model path resolution, weight loading and its errors, dummy weights, dtypes, GGUF."""
from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file, save_file

import tamis.engine.embedded as embedded
from tamis.engine.layers.linear import UnquantizedLinearMethod
from tamis.engine.loader import kv_cache_spec, load_model, resolve_model_path

torch.set_num_threads(1)   # 2 threads stall on OpenMP barriers when the CPUs are shared


def engine_config(model, **kw):
    fields = dict(model=None if model is None else str(model), dtype="auto", load_format="auto",
                  quantization=None, seed=0, attention_backend="torch")
    return SimpleNamespace(**{**fields, **kw})


def copy_checkpoint(src, dst, edit_tensors=None, edit_config=None):
    shutil.copytree(src, dst)
    if edit_tensors:
        tensors = edit_tensors(load_file(str(dst / "model.safetensors")))
        save_file(tensors, str(dst / "model.safetensors"))
    if edit_config:
        config = json.loads((dst / "config.json").read_text())
        edit_config(config)
        (dst / "config.json").write_text(json.dumps(config))
    return dst


def state(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


# ----------------------------------------------------------------- paths

def test_none_resolves_to_the_embedded_model(smollm2_path):
    assert resolve_model_path(None) == smollm2_path


def test_missing_path_names_it(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(FileNotFoundError, match="no-such-model"):
        resolve_model_path(str(missing))
    with pytest.raises(FileNotFoundError, match="no-such-model"):
        load_model(engine_config(missing), "cpu")


def test_folder_without_config_and_non_gguf_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        resolve_model_path(tmp_path)
    weird = tmp_path / "weights.bin"
    weird.write_bytes(b"x")
    with pytest.raises(ValueError, match="gguf"):
        resolve_model_path(weird)


def test_gguf_file_of_the_embedded_model_loads_its_weights(smollm2_path):
    """The shipped GGUF maps to the embedded folder (converted once, shared)."""
    gguf = embedded.embedded_gguf_path()
    assert resolve_model_path(str(gguf)) == smollm2_path
    model, hf_config = load_model(engine_config(gguf, load_format="gguf"), "cpu")
    assert hf_config.architectures == ["LlamaForCausalLM"] and hf_config.num_hidden_layers == 30
    stored = load_file(str(smollm2_path / "model.safetensors"))
    params = dict(model.named_parameters())
    assert torch.equal(params["model.embed_tokens.weight"], stored["model.embed_tokens.weight"])
    assert model.lm_head.weight is model.model.embed_tokens.weight     # tied embeddings


def test_other_gguf_files_are_converted_once_into_the_cache(tmp_path, monkeypatch, tiny_checkpoint):
    tiny = tiny_checkpoint("llama")    # built before the cache dir moves
    monkeypatch.setenv("TAMIS_CACHE_DIR", str(tmp_path / "cache"))
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF")
    calls = []

    def fake_convert(path, target):
        calls.append(path)
        shutil.copytree(tiny, target)
        (target / ".complete").write_text(str(path))
        return target

    monkeypatch.setattr(embedded, "convert_gguf", fake_convert)
    first, second = resolve_model_path(gguf), resolve_model_path(str(gguf))
    assert first == second and first.parent == tmp_path / "cache" / "models"
    assert calls == [gguf]
    model, hf_config = load_model(engine_config(gguf), "cpu")
    assert hf_config.architectures == ["LlamaForCausalLM"]


def test_tiny_gguf_file_converts_and_matches_its_source_model(tmp_path, monkeypatch):
    """A real GGUF (F32, llama.cpp's q/k row order) through convert_gguf and our loader."""
    from tiny_models import make_tiny_gguf

    from tamis.engine.attention.metadata import forward_context

    gguf_path, source = make_tiny_gguf(tmp_path / "tiny.gguf")
    monkeypatch.setenv("TAMIS_CACHE_DIR", str(tmp_path / "cache"))
    model, hf_config = load_model(engine_config(gguf_path, load_format="gguf"), "cpu")
    assert resolve_model_path(gguf_path).parent == tmp_path / "cache" / "models"
    ids = torch.randint(0, hf_config.vocab_size, (24,))
    with torch.no_grad(), forward_context(None, []):
        logits = model.compute_logits(model(ids, torch.arange(24)))
        expected = source(ids[None]).logits[0]
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=0)


def test_gguf_format_needs_a_gguf_file(tiny_checkpoint):
    with pytest.raises(ValueError, match="gguf"):
        load_model(engine_config(tiny_checkpoint("llama"), load_format="gguf"), "cpu")


# ----------------------------------------------------------------- checkpoint errors

def test_unknown_architecture_names_it_and_the_supported_ones(tiny_checkpoint, tmp_path):
    path = copy_checkpoint(tiny_checkpoint("llama"), tmp_path / "m",
                           edit_config=lambda c: c.update(architectures=["FooForCausalLM"]))
    with pytest.raises(ValueError, match="FooForCausalLM.*LlamaForCausalLM"):
        load_model(engine_config(path), "cpu")


def test_missing_tensor_is_named(tiny_checkpoint, tmp_path):
    name = "model.layers.1.self_attn.k_proj.weight"
    path = copy_checkpoint(tiny_checkpoint("llama"), tmp_path / "m",
                           edit_tensors=lambda t: {k: v for k, v in t.items() if k != name})
    with pytest.raises(ValueError, match=name.replace(".", r"\.")):
        load_model(engine_config(path), "cpu")


def test_unexpected_tensor_is_named(tiny_checkpoint, tmp_path):
    extra = "model.layers.0.mlp.extra_proj.weight"
    path = copy_checkpoint(tiny_checkpoint("qwen3"), tmp_path / "m",
                           edit_tensors=lambda t: {**t, extra: torch.zeros(2, 2)})
    with pytest.raises(ValueError, match=extra.replace(".", r"\.")):
        load_model(engine_config(path), "cpu")


def test_wrong_shape_is_named(tiny_checkpoint, tmp_path):
    name = "model.layers.0.mlp.up_proj.weight"
    path = copy_checkpoint(tiny_checkpoint("llama"), tmp_path / "m",
                           edit_tensors=lambda t: {**t, name: t[name][:-1]})
    with pytest.raises(ValueError, match=name.replace(".", r"\.") + ".*shape"):
        load_model(engine_config(path), "cpu")


def test_sharded_checkpoint_with_index_loads_the_same(tiny_checkpoint, tmp_path):
    src = tiny_checkpoint("qwen2")
    tensors = load_file(str(src / "model.safetensors"))
    names = sorted(tensors)
    dst = copy_checkpoint(src, tmp_path / "m")
    (dst / "model.safetensors").unlink()
    shards = {"model-00001-of-00002.safetensors": names[::2],
              "model-00002-of-00002.safetensors": names[1::2]}
    weight_map = {}
    for file, shard_names in shards.items():
        save_file({n: tensors[n] for n in shard_names}, str(dst / file))
        weight_map.update({n: file for n in shard_names})
    (dst / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    a, b = state(load_model(engine_config(src), "cpu")[0]), state(load_model(engine_config(dst), "cpu")[0])
    assert all(torch.equal(a[k], b[k]) for k in a)


# ----------------------------------------------------------------- dummy, dtype, quant hook

def test_dummy_weights_have_the_checkpoint_shapes_and_follow_the_seed(tiny_checkpoint, tmp_path):
    path = copy_checkpoint(tiny_checkpoint("qwen3"), tmp_path / "m")
    (path / "model.safetensors").unlink()          # dummy never reads weights
    model, hf_config = load_model(engine_config(path, load_format="dummy", seed=1), "cpu")
    expected = {n: t.shape for n, t in load_file(str(tiny_checkpoint("qwen3") / "model.safetensors")).items()}
    params = dict(model.named_parameters())
    qkv = params["model.layers.0.self_attn.qkv_proj.weight"]
    q, k, v = (expected[f"model.layers.0.self_attn.{p}_proj.weight"] for p in "qkv")
    assert qkv.shape == (q[0] + k[0] + v[0], q[1])
    assert params["model.embed_tokens.weight"].shape == expected["model.embed_tokens.weight"]
    assert params["model.layers.1.self_attn.q_norm.weight"].shape == expected["model.layers.1.self_attn.q_norm.weight"]
    assert model.expected_checkpoint_names() == set(expected)
    assert 0.015 < qkv.std().item() < 0.025
    assert torch.equal(params["model.norm.weight"], torch.ones(hf_config.hidden_size))
    again = state(load_model(engine_config(path, load_format="dummy", seed=1), "cpu")[0])
    other = state(load_model(engine_config(path, load_format="dummy", seed=2), "cpu")[0])
    mine = state(model)
    assert all(torch.equal(mine[k], again[k]) for k in mine)
    assert not torch.equal(mine["model.embed_tokens.weight"], other["model.embed_tokens.weight"])


def test_explicit_dtype(tiny_checkpoint):
    model, _ = load_model(engine_config(tiny_checkpoint("llama"), dtype="bfloat16"), "cpu")
    assert model.dtype == torch.bfloat16
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    model, _ = load_model(engine_config(tiny_checkpoint("llama")), "cpu")
    assert model.dtype == torch.float32


def test_quant_config_is_requested_only_when_asked(tiny_checkpoint, monkeypatch, tmp_path):
    import tamis.quant
    calls, prefixes = [], []

    class RecordingConfig:
        def get_name(self):
            return "recording"

        def get_linear_method(self, prefix):
            prefixes.append(prefix)
            return UnquantizedLinearMethod()

    def fake_get_quant_config(model_dir, hf_config, quantization):
        calls.append(quantization)
        return RecordingConfig()

    monkeypatch.setattr(tamis.quant, "get_quant_config", fake_get_quant_config, raising=False)
    load_model(engine_config(tiny_checkpoint("llama")), "cpu")
    assert calls == []
    model, _ = load_model(engine_config(tiny_checkpoint("llama"), quantization="recording"), "cpu")
    assert calls == ["recording"]
    assert "model.layers.1.self_attn.qkv_proj" in prefixes
    assert "model.layers.0.mlp.gate_up_proj" in prefixes and "model.layers.0.mlp.down_proj" in prefixes
    legacy = copy_checkpoint(tiny_checkpoint("llama"), tmp_path / "gptq")
    (legacy / "quantize_config.json").write_text(json.dumps({"bits": 4, "group_size": 128}))
    load_model(engine_config(legacy), "cpu")        # AutoGPTQ's file beside config.json
    assert calls == ["recording", None]


def test_kv_cache_spec(tiny_checkpoint, smollm2_path):
    from transformers import AutoConfig
    spec = kv_cache_spec(AutoConfig.from_pretrained(smollm2_path))
    assert (spec.num_layers, spec.num_kv_heads, spec.head_dim) == (30, 3, 64)
    assert spec.sliding_windows == (None,) * 30
    assert spec.block_bytes(16, torch.float32) == 2 * 30 * 16 * 3 * 64 * 4
    mistral = kv_cache_spec(AutoConfig.from_pretrained(tiny_checkpoint("mistral")))
    assert mistral.sliding_windows == (32, 32)
