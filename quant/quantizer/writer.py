"""Writes quantized linears in the published checkpoint layouts (the ones tamis.quant
loads, and vLLM / transformers read):

```
awq (native)   <name>.qweight [K, N/8] (AWQ order), .qzeros [K/G, N/8], .scales fp16 [K/G, N]
gptq (native)  <name>.qweight [K/P, N], .qzeros [G, N/P] holding zero - 1 (v1),
               .scales fp16 [G, N], .g_idx int32 [K]
compressed-tensors pack-quantized (awq, gptq):
               <name>.weight_packed int32 [N, K/P] (codes, sequential along K),
               .weight_scale float32 [N, G], .weight_shape int64 [2] = (N, K),
               .weight_zero_point int32 [N/P, G] (asymmetric)
compressed-tensors float-quantized (fp8):
               <name>.weight float8_e4m3fn [N, K], .weight_scale float32 [N, 1]
```
(P = 32 / bits codes per int32, G groups along K.) Codes are stored unsigned, which is
compressed-tensors' signed code plus 2**(bits-1); a symmetric grid's zero point is that
offset, so it is not stored. Scales of pack-quantized are written in float32: the
quantizer's float16-exact values, whose products with the codes compressed-tensors then
forms exactly (in float16 they would round). Every other tensor is written in 16 bits
(``checkpoint_dtype``), ``config.json`` gets ``quantization_config``, and the tokenizer
files are copied.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tamis.quant.packing import pack_awq, pack_int32
from tamis.quant.quantizer.fp8 import Fp8Weight
from tamis.quant.quantizer.grid import QuantizedWeight

FORMATS = ("native", "compressed-tensors")

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


def ct_fp8_tensors(name: str, quantized: Fp8Weight) -> dict[str, torch.Tensor]:
    return {f"{name}.weight": quantized.weight.contiguous(),
            f"{name}.weight_scale": quantized.scale.float().reshape(-1, 1).contiguous()}


def ct_pack_tensors(name: str, qw: QuantizedWeight, sym: bool) -> dict[str, torch.Tensor]:
    n, k = qw.codes.shape
    tensors = {f"{name}.weight_packed": pack_int32(qw.codes, qw.bits, dim=1),
               f"{name}.weight_scale": qw.scales.float().contiguous(),
               f"{name}.weight_shape": torch.tensor([n, k], dtype=torch.int64)}
    if sym:
        if not torch.equal(qw.zeros, torch.full_like(qw.zeros, 1 << (qw.bits - 1))):
            raise ValueError(f"{name}: a symmetric grid must have its zero point at "
                             f"{1 << (qw.bits - 1)}")
    else:
        tensors[f"{name}.weight_zero_point"] = pack_int32(qw.zeros.to(torch.int32), qw.bits,
                                                          dim=0)
    return tensors


def quantization_config(method: str, bits: int, group_size: int, desc_act: bool,
                        sym: bool, static_groups: bool = False, true_sequential: bool = False,
                        damp: float = 0.01, fmt: str = "native") -> dict[str, Any]:
    """``quantization_config`` for config.json; the GPTQ provenance fields (damp,
    true-sequential, static groups) record how the checkpoint was made (loaders ignore
    them: ``g_idx`` carries the groups)."""
    if fmt == "compressed-tensors":
        return compressed_tensors_config(method, bits, group_size, sym, static_groups)
    if method == "awq":
        return {"quant_method": "awq", "bits": bits, "group_size": group_size,
                "zero_point": True, "version": "gemm", "modules_to_not_convert": None}
    if method == "gptq":
        return {"quant_method": "gptq", "bits": bits, "group_size": group_size,
                "desc_act": desc_act, "sym": sym, "checkpoint_format": "gptq",
                "damp_percent": damp, "true_sequential": true_sequential,
                "static_groups": static_groups,
                "lm_head": False}
    raise ValueError(f"{method} is written in the compressed-tensors format only")


def compressed_tensors_config(method: str, bits: int, group_size: int, sym: bool,
                              static_groups: bool) -> dict[str, Any]:
    """compressed-tensors' ``quantization_config`` (the fields llm-compressor writes)
    for every Linear but lm_head: FP8 per-channel weights with dynamic per-token FP8
    activations (``float-quantized``, llm-compressor's FP8_DYNAMIC), or int weights
    with float activations (``pack-quantized``, W4A16 / W8A16). ``actorder`` "weight"
    records act-order visiting with groups contiguous in K (static groups), else null;
    dynamic act-order groups ("group", with ``weight_g_idx``) are not written:
    compressed-tensors 0.19 refuses them (``QuantizeOptions`` says so)."""
    if method == "fp8":
        fmt = "float-quantized"
        weights = _ct_args("float", 8, "channel", None, True, None)
        activations = {**_ct_args("float", 8, "token", None, True, None), "dynamic": True,
                       "observer": None}
    else:
        fmt = "pack-quantized"
        actorder = "weight" if static_groups else None
        weights = _ct_args("int", bits, "channel" if group_size == -1 else "group",
                           None if group_size == -1 else group_size, sym, actorder)
        activations = None
    group = {"targets": ["Linear"], "weights": weights, "input_activations": activations,
             "output_activations": None, "format": fmt}
    return {"quant_method": "compressed-tensors", "format": fmt,
            "config_groups": {"group_0": group}, "ignore": ["lm_head"],
            "quantization_status": "compressed", "kv_cache_scheme": None,
            "global_compression_ratio": None, "sparsity_config": {}}


def _ct_args(kind: str, bits: int, strategy: str, group_size: int | None, sym: bool,
             actorder: str | None) -> dict[str, Any]:
    return {"type": kind, "num_bits": bits, "strategy": strategy, "group_size": group_size,
            "symmetric": sym, "dynamic": False, "actorder": actorder,
            "block_structure": None, "observer": "minmax", "observer_kwargs": {}}


def checkpoint_state(model: nn.Module, weights: dict[str, QuantizedWeight | Fp8Weight],
                     method: str, fmt: str, sym: bool,
                     dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The tensors to write: each quantized linear of ``weights`` in ``fmt``'s layout, the
    model's other floating tensors (embeddings, head, norms) in ``dtype``
    (``checkpoint_dtype``): the quantizer works in float32, and a rotated model's untied
    embedding and head would otherwise double the file. The model takes those rounded
    values too, so as the quantizer's reference it stays what the checkpoint holds."""
    quantized_weights = {f"{name}.weight" for name in weights}
    state = {}
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            if name not in quantized_weights and tensor.is_floating_point():
                tensor.copy_(tensor.to(dtype))
                state[name] = tensor.to(dtype, copy=True)
            elif name not in quantized_weights:
                state[name] = tensor.detach().clone()
    if getattr(model.config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    for name, quantized in weights.items():
        state.update(_linear_tensors(name, quantized, method, fmt, sym))
    return state


def _linear_tensors(name: str, quantized, method: str, fmt: str,
                    sym: bool) -> dict[str, torch.Tensor]:
    if method == "fp8":
        return ct_fp8_tensors(name, quantized)
    if fmt == "compressed-tensors":
        return ct_pack_tensors(name, quantized, sym)
    if method == "awq":
        return awq_tensors(name, quantized)
    return gptq_tensors(name, quantized)


def checkpoint_dtype(model_path: Path) -> torch.dtype:
    """The dtype of the tensors a quantized checkpoint keeps unquantized: the source's
    (config.json ``dtype`` / ``torch_dtype``) when it is 16-bit, else bfloat16. Quantized
    checkpoints are served with 16-bit activations, and float32 embeddings would make
    most of a small model's file (both of them, once rotation unties the head)."""
    config = json.loads((model_path / "config.json").read_text())
    name = str(config.get("dtype") or config.get("torch_dtype") or "float32")
    dtype = getattr(torch, name.removeprefix("torch."), None)
    return dtype if dtype in (torch.float16, torch.bfloat16) else torch.bfloat16


def dtype_override(model_path: Path, dtype: torch.dtype) -> dict[str, str]:
    """config.json fields naming ``dtype`` (``torch_dtype`` too where the source has it)."""
    config = json.loads((model_path / "config.json").read_text())
    name = str(dtype).removeprefix("torch.")
    return {key: name for key in ("dtype", "torch_dtype") if key in config} or {"dtype": name}


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
