"""CLI flags for ``EngineConfig`` with vLLM's spellings (``tamis serve`` and ``tamis generate``).

``add_engine_args(parser)`` registers the flags; ``EngineConfig.from_cli_args(args)``
reads them back. Defaults come from the dataclass so the two never disagree.
"""
from __future__ import annotations

import argparse
from dataclasses import MISSING, fields

from tamis.engine import config as cfg
from tamis.engine.config import EngineConfig


def _default(name: str):
    for f in fields(EngineConfig):
        if f.name == name:
            return f.default if f.default is not MISSING else None
    raise KeyError(name)


def _bool_flag(group, name: str, help: str) -> None:
    group.add_argument(cfg.flag(name), dest=name, action=argparse.BooleanOptionalAction,
                       default=_default(name), help=help)


def add_engine_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Adds every engine flag to ``parser`` (in an "engine" group) and returns it."""
    g = parser.add_argument_group("engine")
    g.add_argument("--model", default=None,
                   help="HF model folder, .gguf file or Hub model id (org/name); default: the "
                        "embedded SmolLM2-135M-Instruct")
    g.add_argument("--tokenizer", default=None,
                   help="tokenizer folder or Hub id (default: the model's)")
    g.add_argument("--revision", default=None,
                   help="branch, tag or commit of a Hub model id (default: main)")
    g.add_argument("--tokenizer-revision", default=None,
                   help="branch, tag or commit of a Hub tokenizer id (default: main)")
    g.add_argument("--download-dir", default=None,
                   help="where Hub models are cached (default: $HF_HUB_CACHE, "
                        "~/.cache/huggingface/hub)")
    g.add_argument("--dtype", default="auto", choices=cfg.DTYPES,
                   help="auto = float32 on CPU, the checkpoint's bf16/fp16 on GPU")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--max-model-len", type=int, default=None,
                   help="context length (default: the model's max_position_embeddings)")
    g.add_argument("--block-size", type=int, default=_default("block_size"),
                   help="tokens per KV cache block")
    _bool_flag(g, "enable_prefix_caching", "reuse KV blocks of shared prompt prefixes")
    _bool_flag(g, "disable_hybrid_kv_cache_manager",
               "models mixing sliding-window and global layers (Gemma 2 / 3) keep every "
               "block of every layer instead of releasing the sliding layers' blocks behind "
               "their window (docs/kv_cache.md)")
    g.add_argument("--num-gpu-blocks-override", type=int, default=None,
                   help="fix the number of KV blocks (any device; for tests)")
    g.add_argument("--kv-cache-memory", "--kv-cache-memory-bytes", dest="kv_cache_memory_bytes",
                   default=None, help="KV cache budget, e.g. 2GiB (CPU default: 512MiB)")
    g.add_argument("--gpu-memory-utilization", type=float,
                   default=_default("gpu_memory_utilization"),
                   help="share of GPU memory for weights, activations and the KV cache")
    g.add_argument("--max-num-seqs", type=int, default=_default("max_num_seqs"),
                   help="most requests in one batch")
    g.add_argument("--max-num-batched-tokens", type=int, default=None,
                   help="token budget of one step (default 2048 on CPU, 8192 on GPU)")
    g.add_argument("--quantization", "-q", default=None,
                   help="force a quantization method (default: from config.json)")
    g.add_argument("--load-format", default="auto", choices=cfg.LOAD_FORMATS)
    g.add_argument("--device", default="auto", choices=cfg.DEVICES)
    g.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
    g.add_argument("--attention-backend", default="auto", choices=cfg.ATTENTION_BACKENDS)
    g.add_argument("--structured-outputs-backend", default=_default("structured_outputs_backend"),
                   choices=("auto", "tamis", "xgrammar", "llguidance", "guidance"),
                   help="constraint compiler: tamis (= auto); xgrammar / llguidance if installed")
    _bool_flag(g, "structured_outputs_jump_forward",
               "append the tokens a grammar forces without sampling them (fewer steps; such "
               "requests leave the pipelined schedule and the decode CUDA graphs)")
    g.add_argument("--structured-outputs-time-limit", dest="structured_outputs_time_limit_s",
                   type=float, default=_default("structured_outputs_time_limit_s"),
                   help="seconds one constraint may take to compile (past it: HTTP 503 "
                        "compile_time_limit)")
    g.add_argument("--structured-outputs-workers", type=int, default=None,
                   help="processes building grammar mask rows in parallel (default: on CUDA "
                        "min(8, CPUs - 4), on CPU 0)")
    g.add_argument("--max-logprobs", type=int, default=_default("max_logprobs"))
    g.add_argument("--served-model-name", default=None)
    g.add_argument("--kv-cache-dtype", default="auto", choices=cfg.KV_CACHE_DTYPES)
    _bool_flag(g, "calculate_kv_scales",
               "fp8 cache: layers without k/v scales in the checkpoint measure them on the "
               "first prefill (amax/200 for keys, amax/100 for values) instead of keeping "
               "1.0, and store keys and values rotated, keys less their mean "
               "(docs/kv_cache.md)")
    g.add_argument("--tensor-parallel-size", "-tp", type=int, default=1,
                   help="split every layer over this many processes (one GPU each on CUDA, "
                        "gloo on the CPU); see docs/parallelism.md")
    g.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1,
                   help="split the decoder layers into this many consecutive stages, one "
                        "process group each (combines with --tensor-parallel-size)")
    g.add_argument("--nnodes", type=int, default=_default("nnodes"),
                   help="hosts the ranks run on (each runs world size / nnodes of them)")
    g.add_argument("--node-rank", type=int, default=_default("node_rank"),
                   help="this host's index; 0 runs the engine, others run python -m "
                        "tamis.engine.distributed.node")
    g.add_argument("--master-addr", default=_default("master_addr"),
                   help="address of node 0, where the ranks rendezvous")
    g.add_argument("--master-port", type=int, default=_default("master_port"),
                   help="port of the rendezvous store on node 0")
    g.add_argument("--scheduling-policy", default="fcfs", choices=cfg.SCHEDULING_POLICIES)
    g.add_argument("--skip-tokenizer-init", action="store_true")
    g.add_argument("--trust-remote-code", action="store_true")
    return parser


__all__ = ["add_engine_args"]
