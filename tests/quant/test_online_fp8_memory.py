"""Online FP8 (``quantization="fp8"`` on a high-precision checkpoint) quantizes each weight
as soon as all of its shards are loaded, so loading never holds the model whole in bf16.

On tiny Llama, Mixtral and Qwen3-MoE checkpoints of 12 layers (one layer is a small part
of the model):

- the model is the one quantizing after the load made (the bf16 model loaded whole, then
  every quantized linear and expert stack quantized per channel): the same tensors, the
  same logits, the same greedy tokens;
- the peak of live CPU tensor bytes while loading stays under the FP8 model + the largest
  layer's quantized weights in bf16 + the quantization workspace and one checkpoint
  tensor, a bound the whole bf16 model (what quantizing after the load peaks at) exceeds;
- dummy weights are the quantized bf16 dummy weights and the model computes finite values.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from safetensors import safe_open
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from formats import make_layer
from tamis.engine.attention.metadata import forward_context
from tamis.engine.loader import load_model
from tamis.kernels.fp8 import FP8_DTYPE
from tamis.quant import get_quant_config
from tamis.quant.base import replace_param
from tamis.quant.fp8 import (Fp8LinearMethod, OnlineFp8LinearMethod, check_fp8_device,
                             quantize_weight_per_channel)
from tamis.quant.moe_fp8 import Fp8MoEMethod, OnlineFp8MoEMethod

torch.set_num_threads(1)
_SIZES = dict(vocab_size=512, num_hidden_layers=12, hidden_size=128, intermediate_size=512)
SHAPES = {"llama": _SIZES,
          "mixtral": {**_SIZES, "intermediate_size": 256},
          "qwen3_moe": {**_SIZES, "moe_intermediate_size": 128}}
PROMPT = [7, 300, 12, 45, 99, 3, 250, 18, 77, 401, 5, 64]


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoint):
    return lambda arch: tiny_checkpoint(arch, with_tokenizer=False, **SHAPES[arch])


def _load(path, quantization: str | None, load_format: str = "auto"):
    config = SimpleNamespace(model=str(path), dtype="bfloat16", load_format=load_format,
                             quantization=quantization, seed=0, attention_backend="torch")
    return load_model(config, "cpu")[0]


def _quantize_after_load(reference, online) -> None:
    """Turns the bf16 ``reference`` into what quantizing after the whole load made: each
    layer that ``online`` quantizes gets the serialized-FP8 method and its weights'
    per-channel codes and scales (experts one at a time)."""
    for name, module in online.named_modules():
        method = getattr(module, "quant_method", None)
        target = reference.get_submodule(name)
        if isinstance(method, OnlineFp8LinearMethod):
            target.quant_method = Fp8LinearMethod(static=False)
            weight, scale = quantize_weight_per_channel(target.weight.data)
            replace_param(target, "weight", weight)
            replace_param(target, "weight_scale", scale)
            check_fp8_device(target, weight.device)
        elif isinstance(method, OnlineFp8MoEMethod):
            target.quant_method = Fp8MoEMethod(static=False)
            for stack in ("w13", "w2"):
                pairs = [quantize_weight_per_channel(expert)
                         for expert in getattr(target, f"{stack}_weight").data]
                replace_param(target, f"{stack}_weight", torch.stack([c for c, _ in pairs]))
                replace_param(target, f"{stack}_weight_scale", torch.stack([s for _, s in pairs]))
            check_fp8_device(target, target.w13_weight.device)


def _assert_same_tensors(model, reference) -> None:
    ours, theirs = dict(model.named_parameters()), dict(reference.named_parameters())
    assert ours.keys() == theirs.keys()
    for name, param in ours.items():
        assert param.dtype == theirs[name].dtype and param.shape == theirs[name].shape, name
        as_bytes = torch.uint8 if param.dtype == FP8_DTYPE else param.dtype
        assert torch.equal(param.view(as_bytes), theirs[name].view(as_bytes)), name


@torch.no_grad()
def _greedy(model, prompt: list[int], steps: int = 8) -> tuple[torch.Tensor, list[int]]:
    """(the prompt's logits, ``steps`` greedy tokens), the sequence recomputed each step."""
    ids, prompt_logits = list(prompt), None
    for _ in range(steps):
        with forward_context(None, []):
            hidden = model(torch.tensor(ids), torch.arange(len(ids)))
        logits = model.compute_logits(hidden)
        prompt_logits = logits if prompt_logits is None else prompt_logits
        ids.append(int(logits[-1].argmax()))
    return prompt_logits, ids[len(prompt):]


def _fp8_weights(model) -> list[torch.Tensor]:
    return [p for p in model.parameters() if p.dtype == FP8_DTYPE]


@pytest.mark.parametrize("arch", sorted(SHAPES))
def test_online_fp8_is_quantizing_after_the_load(checkpoint, arch):
    model = _load(checkpoint(arch), "fp8")
    reference = _load(checkpoint(arch), None)
    _quantize_after_load(reference, model)
    assert len(_fp8_weights(model)) == len(_fp8_weights(reference)) > 24
    _assert_same_tensors(model, reference)
    logits, tokens = _greedy(model, PROMPT)
    expected_logits, expected_tokens = _greedy(reference, PROMPT)
    assert torch.equal(logits, expected_logits)
    assert tokens == expected_tokens


class PeakLiveBytes(TorchDispatchMode):
    """The peak, over the ops run while active, of the bytes held by the live CPU
    storages those ops returned (a storage counts until it is freed)."""

    def __init__(self):
        super().__init__()
        self.live: dict[int, tuple[StorageWeakRef, int]] = {}
        self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        # Freed storages go first: a new one may take a freed one's address (the key).
        self.live = {key: entry for key, entry in self.live.items() if not entry[0].expired()}
        for tensor in tree_leaves(out):
            if isinstance(tensor, torch.Tensor) and tensor.device.type == "cpu":
                storage = tensor.untyped_storage()
                self.live.setdefault(storage._cdata, (StorageWeakRef(storage), storage.nbytes()))
        self.peak = max(self.peak, sum(nbytes for _, nbytes in self.live.values()))
        return out


def _model_bytes(model) -> int:
    tensors = {t.untyped_storage()._cdata: t.untyped_storage().nbytes()
               for t in [*model.parameters(), *model.buffers()]}
    return sum(tensors.values())


def _largest_layer_in_bf16(model) -> int:
    """Bytes of one decoder layer's quantized weights in bf16 (the largest layer's)."""
    return max(2 * sum(w.numel() for w in _fp8_weights(layer)) for layer in model.model.layers)


def _quantization_workspace(model) -> int:
    """Two float32 copies of the largest tensor quantized at once (a linear's weight, an
    expert's projections): ``quantize_fp8``'s upcast and quotient."""
    return 2 * 4 * max(w[0].numel() if w.dim() == 3 else w.numel() for w in _fp8_weights(model))


def _largest_checkpoint_tensor(path) -> int:
    with safe_open(str(path / "model.safetensors"), framework="pt") as handle:
        return max(handle.get_tensor(name).nbytes for name in handle.keys())


@pytest.mark.parametrize("load_format", ["auto", "dummy"])
@pytest.mark.parametrize("arch", ["llama", "mixtral"])
def test_loading_peaks_at_the_fp8_model_and_one_bf16_layer(checkpoint, arch, load_format):
    path = checkpoint(arch)
    with PeakLiveBytes() as memory:
        model = _load(path, "fp8", load_format)
    fp8_model = _model_bytes(model)
    bound = (fp8_model + _largest_layer_in_bf16(model) + _quantization_workspace(model)
             + _largest_checkpoint_tensor(path))
    assert memory.peak <= bound, f"peak {memory.peak} bytes, bound {bound}"
    # The bound excludes holding the model whole in bf16 (quantizing after the load did).
    scales = sum(p.nbytes for name, p in model.named_parameters() if name.endswith("_scale"))
    bf16_model = fp8_model - scales + sum(w.numel() for w in _fp8_weights(model))
    assert bf16_model > bound + _largest_layer_in_bf16(model)
    assert memory.peak > fp8_model   # the tracker sees the model being built


@pytest.mark.parametrize("arch", ["llama", "mixtral"])
def test_dummy_weights_are_the_quantized_bf16_dummy_weights(checkpoint, arch):
    model = _load(checkpoint(arch), "fp8", "dummy")
    reference = _load(checkpoint(arch), None, "dummy")
    _quantize_after_load(reference, model)
    _assert_same_tensors(model, reference)
    with torch.no_grad(), forward_context(None, []):
        hidden = model(torch.tensor(PROMPT), torch.arange(len(PROMPT)))
    logits = model.compute_logits(hidden)
    assert logits.shape == (len(PROMPT), 512) and torch.isfinite(logits).all()
    assert logits.std() > 0


def _qkv_layer():
    config = get_quant_config("/nonexistent", {}, "fp8")
    layer = make_layer(config, 32, [16, 8, 8], prefix="model.layers.3.self_attn.qkv_proj")
    return layer, layer.weight, {"q": torch.randn(16, 32), "k": torch.randn(8, 32),
                                 "v": torch.randn(8, 32)}


def test_a_weight_stays_a_placeholder_until_its_last_shard_is_loaded():
    layer, weight, shards = _qkv_layer()
    assert weight.is_meta
    weight.weight_loader(weight, shards["q"], "q")
    weight.weight_loader(weight, shards["v"], "v")
    assert weight.staged.quantized is None and weight.staged.staging is not None
    weight.weight_loader(weight, shards["k"], "k")
    assert weight.staged.staging is None and weight.staged.quantized is not None
    layer.process_weights_after_loading()
    codes, scales = quantize_weight_per_channel(torch.cat(list(shards.values())))
    assert torch.equal(layer.weight.view(torch.uint8), codes.view(torch.uint8))
    assert torch.equal(layer.weight_scale, scales)


def test_a_missing_shard_and_a_shard_loaded_twice_are_refused_by_name():
    layer, weight, shards = _qkv_layer()
    weight.weight_loader(weight, shards["q"], "q")
    weight.weight_loader(weight, shards["k"], "k")
    with pytest.raises(ValueError, match=r"model.layers.3.self_attn.qkv_proj: only 768 "
                                         r"elements of a weight were loaded"):
        layer.process_weights_after_loading()
    weight.weight_loader(weight, shards["v"], "v")
    with pytest.raises(ValueError, match="arrived after all of it was loaded and quantized"):
        weight.weight_loader(weight, shards["q"], "q")


def test_tensor_parallel_ranks_quantize_their_own_slices():
    """Column-parallel ranks keep rows of each shard, row-parallel ranks a K slice; each
    quantizes what it keeps, per channel."""
    from tamis.engine.distributed.parallel_state import TPGroup, tensor_parallel
    from tamis.engine.layers.linear import MergedColumnLinear, RowLinear

    config = get_quant_config("/nonexistent", {}, "fp8")
    gate, up, down = torch.randn(24, 64), torch.randn(24, 64), torch.randn(64, 48)
    for rank in range(2):
        with tensor_parallel(TPGroup(rank, 2)):
            column = MergedColumnLinear(64, [24, 24], quant_config=config,
                                        prefix="model.layers.0.mlp.gate_up_proj")
            row = RowLinear(48, 64, quant_config=config, prefix="model.layers.0.mlp.down_proj")
        column.weight.weight_loader(column.weight, gate, 0)
        column.weight.weight_loader(column.weight, up, 1)
        row.weight.weight_loader(row.weight, down)
        for layer in (column, row):
            layer.process_weights_after_loading()
        kept = {column: torch.cat([gate[rank * 12:][:12], up[rank * 12:][:12]]),
                row: down[:, rank * 24:][:, :24]}
        for layer, weight in kept.items():
            codes, scales = quantize_weight_per_channel(weight)
            assert torch.equal(layer.weight.view(torch.uint8), codes.view(torch.uint8))
            assert torch.equal(layer.weight_scale, scales)
