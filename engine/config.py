"""Engine configuration: one dataclass, validated on construction.

Names and meanings follow vLLM's engine arguments so users can carry their commands
over (``--max-model-len``, ``--gpu-memory-utilization``, ``--num-gpu-blocks-override``...).
Values that depend on the model or the device (``max_model_len``, ``dtype="auto"``,
``max_num_batched_tokens``) stay as given here and are resolved by the engine once
the checkpoint's config is read (``resolve_*`` helpers below).

Every invalid value raises ``ValueError`` naming the CLI flag, so the message says
what to change.

torch is imported inside the functions that use it, not here: ``tamis serve`` parses its
flags and takes its port before it pays for importing torch (1-2 s), so that a busy port
fails at once.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

DEFAULT_CPU_KV_CACHE_BYTES = 512 * 1024**2   # a modest budget: never swallow the machine
DEFAULT_CPU_BATCHED_TOKENS = 2048
DEFAULT_GPU_BATCHED_TOKENS = 8192

DTYPES = ("auto", "float32", "float16", "bfloat16", "half", "float", "fp32", "fp16", "bf16")
LOAD_FORMATS = ("auto", "safetensors", "gguf", "dummy")
DEVICES = ("auto", "cpu", "cuda")
ATTENTION_BACKENDS = ("auto", "torch", "triton")
SCHEDULING_POLICIES = ("fcfs", "priority")
# fp8 = fp8_e4m3 (float8_e4m3fn with per-layer scales, as vLLM's); e5m2 is not offered.
KV_CACHE_DTYPES = ("auto", "float32", "float16", "bfloat16", "fp8", "fp8_e4m3")

_DTYPE_NAMES = {   # a --dtype spelling -> the name of its torch dtype
    "float32": "float32", "float": "float32", "fp32": "float32",
    "float16": "float16", "half": "float16", "fp16": "float16",
    "bfloat16": "bfloat16", "bf16": "bfloat16",
}
_SIZE_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2,
               "g": 1000**3, "gb": 1000**3, "t": 1000**4, "tb": 1000**4,
               "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4}


def flag(name: str) -> str:
    """The CLI spelling of a field: ``max_model_len`` -> ``--max-model-len``."""
    return "--" + name.replace("_", "-")


def parse_size(value: int | float | str, name: str = "kv_cache_memory_bytes") -> int:
    """Bytes from ``1073741824``, ``"512MiB"``, ``"2GiB"``, ``"1.5GB"`` (case-insensitive)."""
    if isinstance(value, bool):
        raise ValueError(f"{flag(name)} must be a size such as 2GiB, got {value!r}")
    if isinstance(value, (int, float)):
        return int(value)
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(value))
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _SIZE_UNITS:
        raise ValueError(f"{flag(name)} must be a size such as 512MiB or 2GiB, got {value!r}")
    return int(float(match.group(1)) * _SIZE_UNITS[unit])


@dataclass
class EngineConfig:
    model: str | None = None                 # None = the embedded SmolLM2; a folder, .gguf or Hub id
    tokenizer: str | None = None             # None = the model's folder
    revision: str | None = None              # branch, tag or commit of a Hub model id (None = main)
    tokenizer_revision: str | None = None    # the same for a Hub tokenizer id
    download_dir: str | None = None          # Hub cache folder (None = HF_HUB_CACHE)
    dtype: str = "auto"                      # auto: float32 on CPU, checkpoint's bf16/fp16 on GPU
    seed: int = 0
    max_model_len: int | None = None        # None = the model's max_position_embeddings
    block_size: int = 16
    enable_prefix_caching: bool = True
    num_gpu_blocks_override: int | None = None
    kv_cache_memory_bytes: int | str | None = None   # CPU budget (or a fixed GPU budget)
    gpu_memory_utilization: float = 0.9
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None
    quantization: str | None = None
    load_format: str = "auto"
    device: str = "auto"
    enforce_eager: bool = False
    attention_backend: str = "auto"
    structured_outputs_backend: str = "tamis"     # auto|tamis (ours), xgrammar|llguidance if installed
    # Append the tokens a grammar forces without sampling them (fewer steps, but a step
    # that feeds several tokens leaves the decode CUDA graphs, and such requests cannot be
    # pipelined): off by default, as in vLLM.
    structured_outputs_jump_forward: bool = False
    # Processes that build the mask rows of newly reached automaton states in parallel
    # (tamis.constrain.row_workers); None: on CUDA min(8, CPUs - 4), on CPU none (the
    # forward pass needs the cores there).
    structured_outputs_workers: int | None = None
    # Seconds one constraint may take to compile; past it the request fails with the
    # "compile_time_limit" code (HTTP 503) and the compile stops.
    structured_outputs_time_limit_s: float = 10.0
    max_logprobs: int = 20
    served_model_name: str | None = None
    kv_cache_dtype: str = "auto"
    # FP8 cache: layers without checkpoint scales measure theirs (and their mean key) on
    # the first prefill (engine/layers/attention.py) instead of keeping 1.0. Other caches
    # ignore it.
    calculate_kv_scales: bool = False
    # Hybrid models (sliding-window layers beside global ones): one block table per group
    # of layers, sliding groups releasing blocks behind their window (engine/kv_groups.py).
    # Disabled, every layer keeps every block in one table.
    disable_hybrid_kv_cache_manager: bool = False
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    # Several hosts: this one is node ``node_rank`` of ``nnodes``, each running
    # world_size / nnodes ranks; node 0 runs rank 0 (the engine) and the rendezvous store
    # at master_addr:master_port (docs/parallelism.md).
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    scheduling_policy: str = "fcfs"
    skip_tokenizer_init: bool = False
    trust_remote_code: bool = False

    def __post_init__(self) -> None:
        if self.kv_cache_memory_bytes is not None:
            self.kv_cache_memory_bytes = parse_size(self.kv_cache_memory_bytes)
        self._check_choices()
        self._check_numbers()
        self._check_names()

    def _check_names(self) -> None:
        for name in ("model", "tokenizer", "revision", "tokenizer_revision", "download_dir"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, (str, os.PathLike)) and str(value).strip()):
                raise ValueError(f"{flag(name)} must be a non-empty string, got {value!r}")

    def _check_choices(self) -> None:
        choices = {"dtype": DTYPES, "load_format": LOAD_FORMATS, "device": DEVICES,
                   "attention_backend": ATTENTION_BACKENDS, "kv_cache_dtype": KV_CACHE_DTYPES,
                   "scheduling_policy": SCHEDULING_POLICIES}
        if self.kv_cache_dtype == "fp8_e5m2":
            raise ValueError("--kv-cache-dtype fp8_e5m2 is not supported: use fp8 (e4m3, "
                             "with the checkpoint's or unit scales)")
        for name, allowed in choices.items():
            value = getattr(self, name)
            if value not in allowed:
                raise ValueError(f"{flag(name)} must be one of {', '.join(allowed)}; got {value!r}")
        from tamis.constrain.backends import check_installed   # ValueError: unknown / not installed
        check_installed(self.structured_outputs_backend)
        if self.device == "cuda" and not _cuda_available():
            raise ValueError("--device cuda was asked for but no CUDA device is available")

    def _check_numbers(self) -> None:
        _positive(self, "block_size", "max_num_seqs", "tensor_parallel_size",
                  "pipeline_parallel_size", "nnodes", "master_port")
        self._check_nodes()
        if not self.structured_outputs_time_limit_s > 0:
            raise ValueError(f"{flag('structured_outputs_time_limit_s')} must be > 0, "
                             f"got {self.structured_outputs_time_limit_s}")
        if self.structured_outputs_workers is not None and self.structured_outputs_workers < 0:
            raise ValueError(f"{flag('structured_outputs_workers')} must be >= 0, "
                             f"got {self.structured_outputs_workers}")
        _positive_or_none(self, "max_model_len", "max_num_batched_tokens",
                          "num_gpu_blocks_override", "kv_cache_memory_bytes")
        if self.block_size & (self.block_size - 1):
            raise ValueError(f"--block-size must be a power of two, got {self.block_size}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError("--gpu-memory-utilization must be in (0, 1], got "
                             f"{self.gpu_memory_utilization}")
        if self.max_logprobs < -1:
            raise ValueError(f"--max-logprobs must be >= -1 (-1 = whole vocabulary), "
                             f"got {self.max_logprobs}")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(f"--max-num-batched-tokens ({self.max_num_batched_tokens}) must be "
                             f">= --max-num-seqs ({self.max_num_seqs})")
        per_node = self.world_size // self.nnodes
        if per_node > 1 and self.device != "cpu" and _cuda_available() and \
                per_node > _cuda_device_count():
            raise ValueError(f"--tensor-parallel-size {self.tensor_parallel_size} x "
                             f"--pipeline-parallel-size {self.pipeline_parallel_size} over "
                             f"{self.nnodes} node(s) needs {per_node} GPUs per node; "
                             f"{_cuda_device_count()} are visible")
        if not isinstance(self.seed, int):
            raise ValueError(f"--seed must be an integer, got {self.seed!r}")

    def _check_nodes(self) -> None:
        if not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"--node-rank must be in [0, --nnodes {self.nnodes}), "
                             f"got {self.node_rank}")
        if self.world_size % self.nnodes:
            raise ValueError(f"--nnodes {self.nnodes} must divide the {self.world_size} ranks "
                             f"(--tensor-parallel-size x --pipeline-parallel-size)")

    @property
    def world_size(self) -> int:
        """Processes (GPUs on CUDA) the engine runs on: tensor x pipeline parallel sizes."""
        return self.tensor_parallel_size * self.pipeline_parallel_size

    # --- resolution once the device and the checkpoint are known -----------------------

    def resolved_device(self) -> torch.device:
        import torch

        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    def resolved_structured_outputs_workers(self, device: torch.device) -> int:
        if self.structured_outputs_workers is not None:
            return self.structured_outputs_workers
        return min(8, max(0, (os.cpu_count() or 1) - 4)) if device.type == "cuda" else 0

    def resolved_max_num_batched_tokens(self, device: torch.device) -> int:
        if self.max_num_batched_tokens is not None:
            return self.max_num_batched_tokens
        default = DEFAULT_GPU_BATCHED_TOKENS if device.type == "cuda" else DEFAULT_CPU_BATCHED_TOKENS
        return max(default, self.max_num_seqs)

    @classmethod
    def from_cli_args(cls, args: Any) -> "EngineConfig":
        """Builds the config from an argparse namespace filled by ``add_engine_args``."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in vars(args).items() if k in names})

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> "EngineConfig":
        """Like the constructor, but an unknown keyword names the valid ones."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise TypeError(f"unknown engine argument(s) {unknown}; valid ones: {sorted(names)}")
        return cls(**kwargs)


def resolve_dtype(dtype: str, device: torch.device, hf_config: Any = None) -> torch.dtype:
    """The compute dtype: explicit names map directly; ``auto`` is float32 on CPU and the
    checkpoint's float16/bfloat16 on GPU (bfloat16 for a float32 checkpoint)."""
    import torch

    if dtype != "auto":
        return getattr(torch, _DTYPE_NAMES[dtype])
    if device.type == "cpu":
        return torch.float32
    stored = getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None)
    if isinstance(stored, str):
        stored = getattr(torch, _DTYPE_NAMES[stored]) if stored in _DTYPE_NAMES else None
    return stored if stored in (torch.float16, torch.bfloat16) else torch.bfloat16


def resolve_kv_cache_dtype(kv_cache_dtype: str, model_dtype: torch.dtype,
                           device: torch.device) -> torch.dtype:
    """The KV cache's dtype: the model's for ``auto``, float8_e4m3fn for ``fp8``/``fp8_e4m3``."""
    import torch

    if kv_cache_dtype == "auto":
        return model_dtype
    if kv_cache_dtype in ("fp8", "fp8_e4m3"):
        return torch.float8_e4m3fn
    return resolve_dtype(kv_cache_dtype, device)


def resolve_max_model_len(requested: int | None, hf_config: Any) -> int:
    """The context length: the model's ``max_position_embeddings`` unless a smaller one is asked."""
    derived = getattr(hf_config, "max_position_embeddings", None) or getattr(
        hf_config, "max_sequence_length", None)
    if requested is None:
        if derived is None:
            raise ValueError("the model config has no max_position_embeddings: pass --max-model-len")
        return int(derived)
    if derived is not None and requested > derived:
        raise ValueError(f"--max-model-len {requested} exceeds the model's maximum context "
                         f"length {derived} (max_position_embeddings)")
    return requested


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def _cuda_device_count() -> int:
    import torch

    return torch.cuda.device_count()


def _positive(config: EngineConfig, *names: str) -> None:
    for name in names:
        value = getattr(config, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{flag(name)} must be a positive integer, got {value!r}")


def _positive_or_none(config: EngineConfig, *names: str) -> None:
    for name in names:
        if getattr(config, name) is not None:
            _positive(config, name)


__all__ = ["EngineConfig", "parse_size", "resolve_dtype", "resolve_max_model_len", "flag",
           "DEFAULT_CPU_KV_CACHE_BYTES"]
