"""EngineConfig: vLLM's names and defaults, validation naming the flag, CLI round trip."""
from __future__ import annotations

import argparse
from types import SimpleNamespace

import pytest
import torch

from tamis.engine.arg_utils import add_engine_args
from tamis.engine.config import (EngineConfig, parse_size, resolve_dtype, resolve_max_model_len)


def test_defaults_follow_the_contract():
    config = EngineConfig()
    assert config.model is None and config.dtype == "auto" and config.block_size == 16
    assert config.enable_prefix_caching is True and config.gpu_memory_utilization == 0.9
    assert config.max_num_seqs == 256 and config.max_logprobs == 20 and config.load_format == "auto"
    assert config.resolved_max_num_batched_tokens(torch.device("cpu")) == 2048


@pytest.mark.parametrize("kwargs, flag", [
    ({"block_size": 0}, "--block-size"), ({"block_size": 12}, "--block-size"),
    ({"max_num_seqs": 0}, "--max-num-seqs"), ({"max_model_len": -5}, "--max-model-len"),
    ({"gpu_memory_utilization": 1.5}, "--gpu-memory-utilization"),
    ({"dtype": "float8"}, "--dtype"), ({"load_format": "pickle"}, "--load-format"),
    ({"device": "tpu"}, "--device"), ({"num_gpu_blocks_override": 0}, "--num-gpu-blocks-override"),
    ({"kv_cache_memory_bytes": "lots"}, "--kv-cache-memory-bytes"),
    ({"max_num_batched_tokens": 8, "max_num_seqs": 16}, "--max-num-batched-tokens"),
    ({"scheduling_policy": "sjf"}, "--scheduling-policy"),
    ({"attention_backend": "flash"}, "--attention-backend"),
    ({"max_logprobs": -3}, "--max-logprobs"),
])
def test_invalid_values_name_the_flag(kwargs, flag):
    with pytest.raises(ValueError, match=flag):
        EngineConfig(**kwargs)


@pytest.mark.parametrize("text, expected", [
    ("2GiB", 2 * 1024**3), ("512MiB", 512 * 1024**2), ("1.5GB", 1_500_000_000), ("4096", 4096),
    (1024, 1024), ("64 mib", 64 * 1024**2)])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


def test_cli_round_trip():
    parser = add_engine_args(argparse.ArgumentParser())
    args = parser.parse_args(["--model", "/m", "--max-model-len", "512", "--kv-cache-memory", "2GiB",
                              "--no-enable-prefix-caching", "--num-gpu-blocks-override", "33",
                              "--dtype", "bfloat16", "--seed", "7", "--max-num-seqs", "8",
                              "--scheduling-policy", "priority", "--enforce-eager"])
    config = EngineConfig.from_cli_args(args)
    assert config.model == "/m" and config.max_model_len == 512
    assert config.kv_cache_memory_bytes == 2 * 1024**3 and config.enable_prefix_caching is False
    assert config.num_gpu_blocks_override == 33 and config.dtype == "bfloat16" and config.seed == 7
    assert config.max_num_seqs == 8 and config.scheduling_policy == "priority" and config.enforce_eager
    defaults = EngineConfig.from_cli_args(parser.parse_args([]))
    assert defaults == EngineConfig()


def test_unknown_kwarg_lists_valid_names():
    with pytest.raises(TypeError, match="max_model_len"):
        EngineConfig.from_kwargs(max_len=3)


def test_resolve_dtype_and_max_model_len():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    bf16_ckpt = SimpleNamespace(dtype=torch.bfloat16)
    assert resolve_dtype("auto", cpu, bf16_ckpt) == torch.float32
    assert resolve_dtype("auto", cuda, bf16_ckpt) == torch.bfloat16
    assert resolve_dtype("auto", cuda, SimpleNamespace(dtype="float16")) == torch.float16
    assert resolve_dtype("auto", cuda, SimpleNamespace(dtype=torch.float32)) == torch.bfloat16
    assert resolve_dtype("half", cpu) == torch.float16
    hf = SimpleNamespace(max_position_embeddings=2048)
    assert resolve_max_model_len(None, hf) == 2048 and resolve_max_model_len(100, hf) == 100
    with pytest.raises(ValueError, match="--max-model-len 4096 exceeds"):
        resolve_max_model_len(4096, hf)
