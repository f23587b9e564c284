"""From a model name to a loaded model: path resolution, weights, KV cache shape.

``load_model(config, device) -> (model, hf_config)`` reads ``config.model``,
``config.dtype``, ``config.load_format``, ``config.quantization``, ``config.seed``
(and ``config.attention_backend`` when present) from any object with those fields.

``config.model`` is a local folder, a ``.gguf`` file, or a Hugging Face Hub model id
(``org/name``, at ``config.revision``, cached under ``config.download_dir``: see
``tamis.engine.hub``).

Load formats:
- ``auto``: a folder's ``*.safetensors`` (a ``.gguf`` path is converted first);
- ``safetensors``: the same, but a folder without safetensors files is an error;
- ``gguf``: ``config.model`` must be a ``.gguf`` file; it is dequantized once into a
  cached safetensors folder (``tamis.engine.embedded.convert_gguf``) and loaded from there;
- ``dummy``: random weights at the config's shapes (normal, std 0.02; norms at 1),
  deterministic for a given ``config.seed`` and device type: for benchmarks, no
  checkpoint read.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch

from tamis.engine.attention.backends import get_attention_backend
from tamis.engine.distributed.parallel_state import current_pp_group, current_tp_group
from tamis.engine.kv_groups import KVCacheGroup, kv_cache_groups, layer_slots
from tamis.engine.models.base import head_dim_of
from tamis.engine.models.registry import get_model_class

LOAD_FORMATS = ("auto", "safetensors", "gguf", "dummy")
DUMMY_STD = 0.02


@dataclass(frozen=True)
class KVCacheSpec:
    """Shape of the paged KV cache: ``sliding_windows[i]`` is layer i's window (None =
    full attention); the layers form KV-cache groups (``tamis.engine.kv_groups``), and
    layer i uses cache tensor ``layer_slots[i][1]`` of shape
    ``[2, num_blocks, block_size, num_kv_heads, head_dim]``, at its group's block ids.
    ``cached_layers``: the layers whose cache this rank holds (all of them, but for a
    pipeline stage). ``hybrid`` False: one group of every layer, whatever their windows."""
    num_layers: int
    num_kv_heads: int
    head_dim: int
    sliding_windows: tuple[int | None, ...]
    cached_layers: range | None = None
    hybrid: bool = True

    @property
    def layers(self) -> range:
        return self.cached_layers if self.cached_layers is not None else range(self.num_layers)

    @functools.cached_property
    def groups(self) -> tuple[KVCacheGroup, ...]:
        return kv_cache_groups(self.sliding_windows, self.hybrid)

    @property
    def group_windows(self) -> tuple[int | None, ...]:
        return tuple(group.sliding_window for group in self.groups)

    @functools.cached_property
    def layer_slots(self) -> tuple[tuple[int, int], ...]:
        """``(group, tensor slot)`` of every layer."""
        return layer_slots(self.groups, self.num_layers)

    @property
    def cached_slots(self) -> list[int]:
        """The cache tensors this rank holds: the slots its layers use."""
        return sorted({self.layer_slots[layer][1] for layer in self.layers})

    def block_bytes(self, block_size: int, dtype: torch.dtype) -> int:
        """Bytes one block takes across this rank's cache tensors (keys and values)."""
        itemsize = torch.empty((), dtype=dtype).element_size()
        return 2 * len(self.cached_slots) * block_size * self.num_kv_heads * self.head_dim * itemsize


def kv_cache_spec(hf_config, tensor_parallel_size: int = 1,
                  cached_layers: range | None = None, hybrid: bool = True) -> KVCacheSpec:
    """The cache layout the model built from ``hf_config`` uses (its architecture decides
    which layers slide); under tensor parallelism, one rank's (its share of the key/value
    heads, at least one); for a pipeline stage, of its ``cached_layers``."""
    num_kv_heads = getattr(hf_config, "num_key_value_heads", None) or hf_config.num_attention_heads
    num_kv_heads = max(1, num_kv_heads // tensor_parallel_size)
    windows = get_model_class(hf_config).sliding_windows(hf_config)
    return KVCacheSpec(hf_config.num_hidden_layers, num_kv_heads, head_dim_of(hf_config),
                       tuple(windows), cached_layers, hybrid)


# ---------------------------------------------------------------- model paths

def model_path(config: Any) -> Path:
    """The local folder of ``config.model`` (``config.revision`` and ``config.download_dir``
    apply to a Hub model id; configs without them mean the default branch and cache)."""
    return resolve_model_path(config.model, getattr(config, "revision", None),
                              getattr(config, "download_dir", None))


def tokenizer_path(config: Any, model_dir: Path) -> Path:
    """The folder to load the tokenizer from: ``config.tokenizer`` (a folder, or a Hub id
    at ``config.tokenizer_revision``), else ``model_dir`` (the model's folder)."""
    from tamis.engine import hub

    tokenizer = getattr(config, "tokenizer", None)
    if tokenizer is None:
        return model_dir
    path = Path(tokenizer).expanduser()
    if path.exists() or not hub.is_hub_model_id(str(tokenizer)):
        return path
    return hub.download_tokenizer(str(tokenizer), getattr(config, "tokenizer_revision", None),
                                  getattr(config, "download_dir", None))


def resolve_model_path(model: str | Path | None, revision: str | None = None,
                       download_dir: str | Path | None = None) -> Path:
    """None -> the embedded SmolLM2 folder; an HF folder -> itself; a ``.gguf`` file ->
    its converted folder (converted once, cached); a Hub model id that is no local path
    (``org/name``) -> its snapshot at ``revision`` in the Hub cache (``download_dir``, else
    ``HF_HUB_CACHE``), downloaded once. Raises FileNotFoundError naming a missing path,
    ValueError for a file that is not GGUF, ``tamis.engine.hub.HubModelError`` when the
    Hub cannot provide the model."""
    from tamis.engine import hub
    from tamis.engine.embedded import default_model_path

    if model is None:
        return default_model_path()
    path = Path(model).expanduser()
    if not path.exists() and hub.is_hub_model_id(str(model)):
        return hub.download_model(str(model), revision, download_dir)
    if not path.exists():
        raise FileNotFoundError(f"model path {str(model)!r} does not exist (expected a Hugging "
                                f"Face model folder, a .gguf file or a Hub model id org/name)")
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"model folder {str(path)!r} has no config.json")
        return path
    if path.suffix.lower() != ".gguf":
        raise ValueError(f"model path {str(path)!r} is a file but not a .gguf checkpoint")
    return gguf_folder(path)


def gguf_folder(gguf_path: Path) -> Path:
    """The cached HF folder converted from ``gguf_path`` (keyed by path, size and mtime).
    The embedded model's own GGUF maps to the embedded folder (converted once, not twice)."""
    from tamis.engine.embedded import (_COMPLETE_MARKER, cache_root, convert_gguf,
                                       default_model_path, embedded_gguf_path)

    with contextlib.suppress(FileNotFoundError):
        if gguf_path.resolve() == embedded_gguf_path().resolve():
            return default_model_path()
    stat = gguf_path.stat()
    key = f"{gguf_path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    target = cache_root() / "models" / f"gguf-{gguf_path.stem}-{digest}"
    if (target / _COMPLETE_MARKER).exists():
        return target
    return convert_gguf(gguf_path, target)


# ---------------------------------------------------------------- loading

def load_model(config: Any, device: torch.device | str) -> tuple[torch.nn.Module, Any]:
    """Builds the model ``config.model`` names on ``device`` and fills its weights.

    Returns ``(model, hf_config)`` with the model in eval mode, ``model.dtype`` set to
    the compute dtype and ``model.model_dir`` to the folder ``config.model`` resolved to
    (a Hub id is resolved once, here). Errors name the problem: unknown architecture (ValueError listing
    the supported ones), missing path (FileNotFoundError), missing or unexpected tensor
    (ValueError naming the tensor), a truncated or corrupt safetensors shard
    (``CheckpointFileError``, a ValueError naming the file).
    """
    from transformers import AutoConfig

    device = torch.device(device)
    load_format = getattr(config, "load_format", "auto") or "auto"
    if load_format not in LOAD_FORMATS:
        raise ValueError(f"unknown load_format {load_format!r}; choose one of {LOAD_FORMATS}")
    if load_format == "gguf" and not str(config.model or "").lower().endswith(".gguf"):
        raise ValueError(f"load_format 'gguf' needs a .gguf file as the model, "
                         f"got {config.model!r}")
    model_dir = model_path(config)
    hf_config = AutoConfig.from_pretrained(model_dir)
    model_cls = get_model_class(hf_config)
    if (current_tp_group().is_parallel or current_pp_group().num_stages > 1) \
            and model_cls.expert_weight_names:
        raise ValueError(f"{model_cls.__name__} (mixture of experts) does not support "
                         f"--tensor-parallel-size or --pipeline-parallel-size > 1 yet; "
                         f"run it in one process")
    dtype = _compute_dtype(config, device, hf_config)
    quant_config = _quant_config(model_dir, hf_config, getattr(config, "quantization", None))
    backend = get_attention_backend(getattr(config, "attention_backend", "auto") or "auto", device)
    with torch.device(device), _default_dtype(dtype):
        model = model_cls(hf_config, quant_config, backend)
    if load_format == "dummy":
        init_dummy_weights(model, getattr(config, "seed", 0) or 0, device)
    else:
        # Under tensor parallelism each rank reads only its slices of the checkpoint.
        lazy = current_tp_group().is_parallel
        loaded = model.load_weights(iter_safetensors(model_dir, lazy=lazy))
        model.check_all_loaded(loaded)
    model.process_weights_after_loading()
    # Imported here: the pass reaches quant/, which imports this module.
    from tamis.engine.models.act_order_fusion import fuse_act_order_permutations
    fuse_act_order_permutations(model)   # act-order layers read x sorted from their producers
    model.dtype = dtype
    model.model_dir = model_dir
    return model.eval(), hf_config


def _compute_dtype(config: Any, device: torch.device, hf_config) -> torch.dtype:
    dtype = getattr(config, "dtype", "auto") or "auto"
    if isinstance(dtype, torch.dtype):
        return dtype
    from tamis.engine.config import resolve_dtype
    try:
        return resolve_dtype(dtype, device, hf_config)
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}") from None


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


# Older AutoGPTQ / AutoAWQ checkpoints keep their settings beside config.json.
_LEGACY_QUANT_FILES = ("quantize_config.json", "quant_config.json")


def _quant_config(model_dir: Path, hf_config, quantization: str | None):
    """The checkpoint's / forced quantization; tamis.quant is imported only when needed."""
    declared = getattr(hf_config, "quantization_config", None) is not None or any(
        (model_dir / name).is_file() for name in _LEGACY_QUANT_FILES)
    if not quantization and not declared:
        return None
    from tamis.quant import get_quant_config
    return get_quant_config(model_dir, hf_config, quantization)


def safetensors_files(model_dir: Path) -> list[Path]:
    """The shards to read: those the index names, else every ``*.safetensors``."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return [model_dir / name for name in sorted(set(weight_map.values()))]
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {str(model_dir)!r} "
                                f"(other checkpoint formats are not supported)")
    return files


class CheckpointFileError(ValueError):
    """A checkpoint file that cannot be read as what its name says (a truncated or
    corrupt safetensors shard); the message names the file and is one line."""


def open_safetensors(file: Path):
    """``safe_open`` of one shard, on the CPU. A file that is not a whole safetensors
    file (an interrupted download or copy, another format under the name) raises
    ``CheckpointFileError`` naming it, instead of the library's bare header error."""
    from safetensors import SafetensorError, safe_open

    try:
        return safe_open(str(file), framework="pt", device="cpu")
    except SafetensorError as exc:
        raise CheckpointFileError(
            f"{file}: not a complete safetensors file ({exc}); it is probably truncated "
            f"(an interrupted download or copy): fetch or write it again") from None


def check_safetensors_files(model_dir: Path) -> list[Path]:
    """The folder's shards (``safetensors_files``), each opened once to check its header
    against its size: ``CheckpointFileError`` names the first incomplete one. Reads the
    headers only, not the tensors."""
    files = safetensors_files(model_dir)
    for file in files:
        with open_safetensors(file):
            pass
    return files


def iter_safetensors(model_dir: Path, lazy: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
    """Streams (name, tensor) shard by shard, so only one tensor is materialised at a time.
    Every shard's header is checked before the first tensor is yielded, so a truncated
    last shard fails the load before any weight is copied (``check_safetensors_files``).
    With ``lazy`` each tensor is a ``CheckpointSlice``, valid until the next one is
    yielded, that reads nothing until sliced or loaded."""
    for file in check_safetensors_files(model_dir):
        with open_safetensors(file) as handle:
            for name in handle.keys():
                yield name, CheckpointSlice(handle, name) if lazy else handle.get_tensor(name)


class CheckpointSlice:
    """One tensor of an open safetensors file, read on demand: ``narrow`` reads only the
    slice (what a tensor-parallel rank keeps), ``load`` the whole tensor."""

    def __init__(self, handle, name: str):
        self._handle, self.name = handle, name
        self._slice = handle.get_slice(name)
        self.shape = torch.Size(self._slice.get_shape())

    def narrow(self, dim: int, start: int, length: int) -> torch.Tensor:
        index = [slice(None)] * len(self.shape)
        index[dim] = slice(start, start + length)
        return self._slice[tuple(index)]

    def load(self) -> torch.Tensor:
        return self._handle.get_tensor(self.name)


def init_dummy_weights(model: torch.nn.Module, seed: int, device: torch.device) -> None:
    """Random weights drawn on the parameters' device (fast for big models on a GPU),
    the same for the same seed and device type: normal(0, 0.02), norm weights 1,
    integer (packed quantized) tensors 0. A parameter whose values must be consistent
    (a quantized layer's group index, shapes, FP8 codes) carries its own
    ``dummy_init(tensor, generator)`` attribute, which is used instead. A placeholder on
    the meta device (a weight quantized online as it loads: ``tamis.quant.online``) has
    one, which draws on the model's ``device``."""
    generators: dict[torch.device, torch.Generator] = {}
    device = torch.empty(0, device=device).device   # "cuda" -> "cuda:0", as parameters say

    def generator(device: torch.device) -> torch.Generator:
        if device not in generators:
            generators[device] = torch.Generator(device=device).manual_seed(seed)
        return generators[device]

    for name, param in model.named_parameters():
        init = getattr(param, "dummy_init", None)
        if init is not None:
            init(param.data, generator(device if param.is_meta else param.device))
        elif not param.dtype.is_floating_point:
            param.data.zero_()
        elif name.endswith("norm.weight"):
            param.data.fill_(1.0)
        else:
            param.data.normal_(0.0, DUMMY_STD, generator=generator(param.device))
