"""Builders of checkpoint tensors straight from the published format descriptions, with
plain Python loops (independent of tamis.quant.packing), and a layer-loading helper that
drives tamis's fused linear layers the way the model loader does."""
from __future__ import annotations

import torch

from tamis.engine.layers.linear import QKVLinear, ReplicatedLinear

AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]  # AutoAWQ gemm.py: nibble i holds column 8c + order[i]


def _to_int32(value: int) -> int:
    return value - (1 << 32) if value >= (1 << 31) else value


def pack_along_rows(values: torch.Tensor, bits: int) -> torch.Tensor:
    """[R, C] -> [ceil(R/P), C]: word r of column c holds rows P*r + j at bits j*bits."""
    per = 32 // bits
    rows, cols = values.shape
    out = torch.zeros(-(-rows // per), cols, dtype=torch.int32)
    for r in range(out.shape[0]):
        for c in range(cols):
            word = 0
            for j in range(per):
                if r * per + j < rows:
                    word |= int(values[r * per + j, c]) << (bits * j)
            out[r, c] = _to_int32(word)
    return out


def pack_along_cols(values: torch.Tensor, bits: int) -> torch.Tensor:
    return pack_along_rows(values.t().contiguous(), bits).t().contiguous()


def pack_awq(values: torch.Tensor) -> torch.Tensor:
    """[R, N] -> [R, N/8] in AutoAWQ's GEMM order."""
    rows, cols = values.shape
    out = torch.zeros(rows, cols // 8, dtype=torch.int32)
    for r in range(rows):
        for c in range(cols // 8):
            word = 0
            for i in range(8):
                word |= int(values[r, 8 * c + AWQ_ORDER[i]]) << (4 * i)
            out[r, c] = _to_int32(word)
    return out


def make_layer(quant_config, input_size: int, shards: list[int] | None = None,
               prefix: str = "model.layers.0.self_attn.qkv_proj", head_dim: int = 8):
    """A QKVLinear (q = shards[0], k = v = shards[1]) or, with one shard, a ReplicatedLinear."""
    if shards and len(shards) == 3:
        assert shards[1] == shards[2]
        return QKVLinear(input_size, head_dim, shards[0] // head_dim, shards[1] // head_dim,
                         quant_config=quant_config, prefix=prefix,
                         params_dtype=torch.float32)
    return ReplicatedLinear(input_size, shards[0] if shards else 32, quant_config=quant_config,
                            prefix=prefix, params_dtype=torch.float32)


def load_layer(layer, tensors: dict[tuple[str, object], torch.Tensor]) -> None:
    """tensors: {(param_name, shard_id or None): checkpoint tensor}; then finalize."""
    params = dict(layer.named_parameters())
    for (name, shard_id), tensor in tensors.items():
        if name not in params:
            raise ValueError(f"unexpected tensor {name!r}")
        param = params[name]
        if shard_id is None:
            param.weight_loader(param, tensor)
        else:
            param.weight_loader(param, tensor, shard_id)
    layer.process_weights_after_loading()
