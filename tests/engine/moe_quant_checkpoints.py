"""Quantized tiny MoE checkpoints in the layouts the quantization libraries write, built
from a tiny transformers checkpoint by round-to-nearest, with the dequantized twin that
transformers runs as the reference (not a test module).

``write_quantized_moe(source, out, fmt) -> (quantized folder, dequantized folder)``:
every decoder linear (attention, dense MLPs and each expert's projections) is quantized;
the routers, norms, embeddings and lm_head stay as they are. Formats (``FORMATS``):

=================  ===============================================================
awq                AutoAWQ GEMM: qweight [K, N/8], qzeros [K/G, N/8] (AWQ order), scales
gptq               AutoGPTQ v1, symmetric: qweight [K/8, N], qzeros [G, N/8] (zero - 1),
                   scales, g_idx [K]
gptq-act-order     the same with shuffled groups (desc_act): g_idx is a permutation of
                   groups, shared by the projections that read the same input
ct-w4a16           compressed-tensors pack-quantized, symmetric: weight_packed [N, K/8]
                   (codes + 8), weight_scale [N, G], weight_shape
fp8-static         vLLM fp8, per-tensor: weight e4m3 [N, K], weight_scale and input_scale
                   scalars (input scales differ between layers and experts)
ct-fp8             compressed-tensors float-quantized: per-channel weight_scale [N, 1],
                   dynamic per-token activations
fp8-block          vLLM / DeepSeek block-wise fp8: weight e4m3 [N, K], weight_scale_inv
                   [ceil(N/128), ceil(K/128)] per projection (the tiny shapes end in
                   partial blocks), dynamic activations; attention is left unquantized
                   (``ignored_layers``: its fused q/k/v shards are not whole blocks)
ct-int8            compressed-tensors int-quantized (W8A8): int8 weight [N, K], per-channel
                   weight_scale [N, 1], dynamic per-token int8 activations
=================  ===============================================================

Packing uses ``tests/quant/formats.py``'s plain loops, not tamis's packers. Group size 32.
The dequantized twin of ``ct-int8`` holds the dequantized weights; its activations must
be fake-quantized per token by the caller (``fake_quant_per_token``) to give the W8A8 math.
"""
from __future__ import annotations

import json
import random
import re
import shutil
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "quant"))
from formats import pack_along_cols, pack_along_rows, pack_awq  # noqa: E402

GROUP = 32
FP8_MAX = 448.0
FP8_BLOCK = 128
INT8_MAX = 127.0
QUANTIZED = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
             "w1", "w2", "w3")
# Projections that read the same input share an act-order (GPTQ needs one per input).
SAME_INPUT = {"q_proj": "qkv", "k_proj": "qkv", "v_proj": "qkv", "gate_proj": "gate_up",
              "up_proj": "gate_up", "w1": "gate_up", "w3": "gate_up"}
CT_IGNORE = ["lm_head", "re:.*mlp.gate$", "re:.*block_sparse_moe.gate$"]
CONFIGS = {
    "awq": {"quant_method": "awq", "bits": 4, "group_size": GROUP, "zero_point": True,
            "version": "gemm", "modules_to_not_convert": ["gate"]},
    "gptq": {"quant_method": "gptq", "bits": 4, "group_size": GROUP, "desc_act": False,
             "sym": True, "checkpoint_format": "gptq"},
    "gptq-act-order": {"quant_method": "gptq", "bits": 4, "group_size": GROUP,
                       "desc_act": True, "sym": True, "checkpoint_format": "gptq"},
    "ct-w4a16": {"quant_method": "compressed-tensors", "format": "pack-quantized",
                 "quantization_status": "compressed", "ignore": CT_IGNORE,
                 "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
                     "type": "int", "num_bits": 4, "strategy": "group",
                     "group_size": GROUP, "symmetric": True}}}},
    "fp8-static": {"quant_method": "fp8", "activation_scheme": "static"},
    "ct-fp8": {"quant_method": "compressed-tensors", "format": "float-quantized",
               "quantization_status": "compressed", "ignore": CT_IGNORE,
               "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
                   "type": "float", "num_bits": 8, "strategy": "channel"},
                   "input_activations": {"type": "float", "num_bits": 8, "strategy": "token",
                                         "dynamic": True}}}},
    "fp8-block": {"quant_method": "fp8", "activation_scheme": "dynamic",
                  "weight_block_size": [FP8_BLOCK, FP8_BLOCK],
                  "ignored_layers": ["re:.*self_attn.*"]},
    "ct-int8": {"quant_method": "compressed-tensors", "format": "int-quantized",
                "quantization_status": "compressed", "ignore": CT_IGNORE,
                "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
                    "type": "int", "num_bits": 8, "strategy": "channel", "symmetric": True},
                    "input_activations": {"type": "int", "num_bits": 8, "strategy": "token",
                                          "dynamic": True, "symmetric": True}}}},
}
# Linears a format leaves in the model dtype (its config ignores them).
UNQUANTIZED = {"fp8-block": re.compile(r".*\.self_attn\..*")}
FORMATS = tuple(CONFIGS)


def round_to_grid(w_t: torch.Tensor, group_of: torch.Tensor, sym: bool):
    """w_t [K, N], group_of int [K] -> (codes, fp16-exact scales [G, N], zeros [G, N],
    dequantized [K, N]) on a 4-bit grid, asymmetric (min/max) or symmetric (zero 8)."""
    groups = int(group_of.max()) + 1
    scales = torch.empty(groups, w_t.shape[1])
    zeros = torch.empty(groups, w_t.shape[1])
    for g in range(groups):
        rows = w_t[group_of == g]
        if sym:
            scales[g], zeros[g] = rows.abs().amax(0) / 7, 8
        else:
            low, high = rows.amin(0).clamp(max=0), rows.amax(0).clamp(min=0)
            scales[g] = (high - low) / 15
            zeros[g] = torch.round(-low / scales[g].half().float()).clamp(0, 15)
    scales = scales.half().float()
    codes = (torch.round(w_t / scales[group_of]) + zeros[group_of]).clamp(0, 15)
    return codes.int(), scales, zeros.int(), (codes - zeros[group_of]) * scales[group_of]


def _act_order_groups(name: str, k: int) -> torch.Tensor:
    module, _, _ = name.rpartition(".")
    head, _, proj = module.rpartition(".")
    rng = random.Random(f"{head}.{SAME_INPUT.get(proj, proj)}")
    groups = [i // GROUP for i in range(k)]
    rng.shuffle(groups)
    return torch.tensor(groups)


def quantize_fp8_blocks(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 codes [N, K], scale_inv [ceil(N/128), ceil(K/128)]): each 128x128 block
    (partial at the edges) scaled by its own amax / 448."""
    n, k = weight.shape
    scale_inv = torch.empty(-(-n // FP8_BLOCK), -(-k // FP8_BLOCK))
    codes = torch.empty(n, k, dtype=torch.float8_e4m3fn)
    for i in range(scale_inv.shape[0]):
        for j in range(scale_inv.shape[1]):
            rows = slice(i * FP8_BLOCK, (i + 1) * FP8_BLOCK)
            cols = slice(j * FP8_BLOCK, (j + 1) * FP8_BLOCK)
            scale_inv[i, j] = weight[rows, cols].abs().max() / FP8_MAX
            codes[rows, cols] = (weight[rows, cols] / scale_inv[i, j]).clamp(
                -FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return codes, scale_inv


def fake_quant_per_token(x: torch.Tensor) -> torch.Tensor:
    """Each row rounded to the int8 grid of amax(row) / 127 (W8A8's activations)."""
    scale = (x.abs().amax(dim=-1, keepdim=True) / INT8_MAX).clamp(min=1e-10 / INT8_MAX)
    return torch.round(x / scale).clamp(-128, INT8_MAX) * scale


def fake_quant_fp8_per_token(x: torch.Tensor) -> torch.Tensor:
    """Each row rounded to float8 e4m3 on the scale amax(row) / 448 (FP8 W8A8's dynamic
    per-token activations)."""
    scale = (x.abs().amax(dim=-1, keepdim=True) / FP8_MAX).clamp(min=1e-10 / FP8_MAX)
    return (x / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).to(x.dtype) * scale


def quantize(name: str, weight: torch.Tensor, fmt: str):
    """(tensors by suffix, dequantized weight [N, K]) for one linear's ``weight`` [N, K]."""
    n, k = weight.shape
    natural = torch.arange(k) // GROUP
    if fmt == "awq":
        codes, scales, zeros, dense = round_to_grid(weight.t(), natural, sym=False)
        return {"qweight": pack_awq(codes), "qzeros": pack_awq(zeros),
                "scales": scales.half()}, dense.t()
    if fmt in ("gptq", "gptq-act-order"):
        group_of = _act_order_groups(name, k) if fmt == "gptq-act-order" else natural
        codes, scales, zeros, dense = round_to_grid(weight.t(), group_of, sym=True)
        return {"qweight": pack_along_rows(codes, 4), "qzeros": pack_along_cols(zeros - 1, 4),
                "scales": scales.half(), "g_idx": group_of.int()}, dense.t()
    if fmt == "ct-w4a16":
        codes, scales, _, dense = round_to_grid(weight.t(), natural, sym=True)
        return {"weight_packed": pack_along_cols(codes.t().contiguous(), 4),
                "weight_scale": scales.t().contiguous().half(),
                "weight_shape": torch.tensor([n, k])}, dense.t()
    if fmt == "fp8-block":
        codes, scale_inv = quantize_fp8_blocks(weight)
        dense = codes.float() * scale_inv.repeat_interleave(FP8_BLOCK, 0)[:n].repeat_interleave(
            FP8_BLOCK, 1)[:, :k]
        return {"weight": codes, "weight_scale_inv": scale_inv}, dense
    if fmt == "ct-int8":
        scale = weight.abs().amax(dim=1, keepdim=True) / INT8_MAX
        codes = torch.round(weight / scale).clamp(-128, INT8_MAX)
        return {"weight": codes.to(torch.int8), "weight_scale": scale}, codes * scale
    per_channel = fmt == "ct-fp8"
    amax = weight.abs().amax(dim=1, keepdim=True) if per_channel else weight.abs().max()
    scale = (amax / FP8_MAX).float()
    codes = (weight / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    tensors = {"weight": codes, "weight_scale": scale}
    if fmt == "fp8-static":
        tensors["input_scale"] = torch.tensor(random.Random(name).uniform(0.03, 0.06))
    return tensors, codes.float() * scale


def fp8_per_channel_round_trip(weight: torch.Tensor) -> torch.Tensor:
    """What online FP8 makes of a weight [N, K]: each row's amax mapped to 448."""
    scale = weight.abs().amax(dim=1, keepdim=True) / FP8_MAX
    return (weight / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).float() * scale


def is_quantized_linear(name: str) -> bool:
    module, _, leaf = name.rpartition(".")
    return leaf == "weight" and module.rpartition(".")[2] in QUANTIZED and ".layers." in name


def write_quantized_moe(source, out, fmt: str) -> tuple[Path, Path]:
    """Quantized and dequantized copies of the HF folder ``source`` under ``out``."""
    from safetensors.torch import load_file, save_file

    source, out = Path(source), Path(out)
    quantized, dequantized = {}, {}
    for name, tensor in load_file(str(source / "model.safetensors")).items():
        skipped = fmt in UNQUANTIZED and UNQUANTIZED[fmt].fullmatch(name)
        if not is_quantized_linear(name) or skipped:
            quantized[name] = dequantized[name] = tensor
            continue
        tensors, dense = quantize(name, tensor, fmt)
        module = name.rpartition(".")[0]
        quantized.update({f"{module}.{suffix}": value for suffix, value in tensors.items()})
        dequantized[name] = dense.to(tensor.dtype)
    folders = out / "quantized", out / "dequantized"
    for folder, tensors in zip(folders, (quantized, dequantized)):
        folder.mkdir(parents=True, exist_ok=True)
        save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
        for file in source.iterdir():
            if file.is_file() and not file.name.endswith(".safetensors"):
                shutil.copy(file, folder / file.name)
    config = json.loads((source / "config.json").read_text())
    config["quantization_config"] = CONFIGS[fmt]
    (folders[0] / "config.json").write_text(json.dumps(config, indent=2))
    return folders


def write_online_fp8_reference(source, out) -> Path:
    """``source`` with every decoder linear replaced by its online-FP8 round trip."""
    from safetensors.torch import load_file, save_file

    source, out = Path(source), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {name: fp8_per_channel_round_trip(t) if is_quantized_linear(name) else t
               for name, t in load_file(str(source / "model.safetensors")).items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    for file in source.iterdir():
        if file.is_file() and not file.name.endswith(".safetensors"):
            shutil.copy(file, out / file.name)
    return out
