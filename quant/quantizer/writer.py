"""Writes quantized linears in the published checkpoint layouts (the ones tamis.quant
loads, and vLLM / transformers read):

```
awq   <name>.qweight [K, N/8] (AWQ order), .qzeros [K/G, N/8], .scales fp16 [K/G, N]
gptq  <name>.qweight [K/P, N], .qzeros [G, N/P] holding zero - 1 (v1), .scales fp16 [G, N],
      .g_idx int32 [K]
fp8   <name>.weight float8_e4m3fn [N, K], .weight_scale float32 [] (per tensor)
```
plus every other tensor unchanged, ``config.json`` with ``quantization_config``, and the
tokenizer files.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

from tamis.quant.packing import pack_awq, pack_int32
from tamis.quant.quantizer.grid import QuantizedWeight

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "chat_template.jinja", "generation_config.json", "vocab.json", "merges.txt",
                   "tokenizer.model")


def awq_tensors(name: str, qw: QuantizedWeight) -> dict[str, torch.Tensor]:
    return {f"{name}.qweight": pack_awq(qw.codes.t()),
            f"{name}.qzeros": pack_awq(qw.zeros.t().to(torch.int32)),
            f"{name}.scales": qw.scales.t().half().contiguous()}


def gptq_tensors(name: str, qw: QuantizedWeight) -> dict[str, torch.Tensor]:
    stored_zeros = qw.zeros.t().to(torch.int32) - 1  # v1 convention
    if (stored_zeros < 0).any():
        raise ValueError(f"{name}: a zero point of 0 cannot be stored in GPTQ v1 format")
    return {f"{name}.qweight": pack_int32(qw.codes.t(), qw.bits, dim=0),
            f"{name}.qzeros": pack_int32(stored_zeros, qw.bits, dim=1),
            f"{name}.scales": qw.scales.t().half().contiguous(),
            f"{name}.g_idx": qw.g_idx.to(torch.int32).contiguous()}


def fp8_tensors(name: str, weight: torch.Tensor, scale: torch.Tensor) -> dict[str, torch.Tensor]:
    return {f"{name}.weight": weight.contiguous(),
            f"{name}.weight_scale": scale.float().reshape(()).contiguous()}


def quantization_config(method: str, bits: int, group_size: int, desc_act: bool,
                        sym: bool, static_groups: bool = False, true_sequential: bool = False,
                        damp: float = 0.01) -> dict[str, Any]:
    """``quantization_config`` for config.json; the GPTQ provenance fields (damp,
    true-sequential, static groups) record how the checkpoint was made (loaders ignore
    them: ``g_idx`` carries the groups)."""
    if method == "awq":
        return {"quant_method": "awq", "bits": bits, "group_size": group_size,
                "zero_point": True, "version": "gemm", "modules_to_not_convert": None}
    if method == "gptq":
        return {"quant_method": "gptq", "bits": bits, "group_size": group_size,
                "desc_act": desc_act, "sym": sym, "checkpoint_format": "gptq",
                "damp_percent": damp, "true_sequential": true_sequential,
                "static_groups": static_groups,
                "lm_head": False}
    return {"quant_method": "fp8", "activation_scheme": "dynamic", "ignored_layers": []}


def write_checkpoint(source: Path, output: Path, state: dict[str, torch.Tensor],
                     quant_config: dict[str, Any],
                     config_overrides: dict[str, Any] | None = None) -> None:
    """Saves ``state`` as model.safetensors, the source's config.json with
    ``quantization_config`` added (and ``config_overrides`` set), and the source's
    tokenizer files."""
    from safetensors.torch import save_file

    output.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in state.items()}, str(output / "model.safetensors"),
              metadata={"format": "pt"})
    config = json.loads((source / "config.json").read_text())
    config.update(config_overrides or {})
    config["quantization_config"] = quant_config
    (output / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copy(source / name, output / name)
