"""Run inside the quantization-libraries venv (see libraries.py), never imported by tamis.

    python library_quantize.py KIND MODEL_DIR OUT_DIR

KIND: ct-w4a16 | ct-gptq-w4a16 | ct-fp8-dynamic (llm-compressor 0.14) | awq-gemm (AutoAWQ
0.2.9). Quantizes the tiny model with that library, saves the checkpoint to OUT_DIR, then
dequantizes every quantized linear with the library's own code and saves those dense
weights to OUT_DIR/reference/dequantized.safetensors (outside the checkpoint) ({module name: float32 [N, K]}).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

CALIBRATION = ("Calibration text for the cross-library test: weights are rounded to a grid; "
               "the library picks scales from activations it observes on this text. ") * 40


def _calibration_dataset(tokenizer, count=4, length=64):
    from datasets import Dataset
    ids = tokenizer(CALIBRATION)["input_ids"]
    rows = [ids[i * length:(i + 1) * length] for i in range(count)]
    return Dataset.from_dict({"input_ids": rows, "attention_mask": [[1] * length for _ in rows]})


def llmcompressor_run(kind: str, model_dir: str, out: Path) -> None:
    from llmcompressor import oneshot
    from llmcompressor.modifiers.gptq import GPTQModifier
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if kind == "ct-w4a16":
        recipe = QuantizationModifier(targets="Linear", scheme="W4A16", ignore=["lm_head"])
        oneshot(model=model, recipe=recipe)
    elif kind == "ct-fp8-dynamic":
        recipe = QuantizationModifier(targets="Linear", scheme="FP8_DYNAMIC", ignore=["lm_head"])
        oneshot(model=model, recipe=recipe)
    else:
        recipe = GPTQModifier(targets="Linear", scheme="W4A16", ignore=["lm_head"])
        oneshot(model=model, recipe=recipe, dataset=_calibration_dataset(tokenizer),
                max_seq_length=64, num_calibration_samples=4)
    model.save_pretrained(out, save_compressed=True)
    tokenizer.save_pretrained(out)
    _ct_dequantize(out)


def _ct_dequantize(out: Path) -> None:
    """compressed-tensors' own decompression of every quantized module in the checkpoint."""
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.quantization import QuantizationScheme
    from safetensors.torch import load_file, save_file

    config = json.loads((out / "config.json").read_text())["quantization_config"]
    (group,) = config["config_groups"].values()
    fmt = group.get("format") or config["format"]
    scheme = QuantizationScheme(**{k: v for k, v in group.items() if k != "format"})
    compressor = BaseCompressor.get_value_from_registry(fmt)
    state = {}
    for file in sorted(out.glob("*.safetensors")):
        state.update(load_file(str(file)))
    modules = sorted({k.rsplit(".", 1)[0] for k in state if k.endswith(".weight_scale")})
    dense = {}
    for module in modules:
        local = {k[len(module) + 1:]: v for k, v in state.items() if k.startswith(module + ".")}
        dense[module] = compressor.decompress(local, scheme)["weight"].float().contiguous()
    (out / "reference").mkdir(exist_ok=True)
    save_file(dense, str(out / "reference" / "dequantized.safetensors"))


def _patch_autoawq_cpu_state_copy() -> None:
    """AutoAWQ's ``_compute_best_scale`` keeps ``{k: v.cpu()}`` as the "original" state dict;
    on CPU that aliases the live weights, so the restore is a no-op and the written model is
    broken. Copy instead (only this expression changes)."""
    import inspect
    import textwrap

    from awq.quantize import quantizer

    source = textwrap.dedent(inspect.getsource(quantizer.AwqQuantizer._compute_best_scale))
    old = "org_sd = {k: v.cpu() for k, v in module2inspect.state_dict().items()}"
    assert old in source, "AutoAWQ changed: update the CPU patch"
    source = source.replace(old, "org_sd = {k: v.detach().clone().cpu() for k, v in "
                                 "module2inspect.state_dict().items()}")
    namespace = dict(vars(quantizer))
    exec(compile(source, quantizer.__file__, "exec"), namespace)
    quantizer.AwqQuantizer._compute_best_scale = namespace["_compute_best_scale"]


def autoawq_run(model_dir: str, out: Path, group_size: int) -> None:
    from awq import AutoAWQForCausalLM
    from awq.utils.packing_utils import dequantize_gemm
    from safetensors.torch import load_file, save_file
    from transformers import AutoTokenizer

    _patch_autoawq_cpu_state_copy()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoAWQForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    quant_config = {"zero_point": True, "q_group_size": group_size, "w_bit": 4, "version": "GEMM"}
    # AutoAWQ drops texts longer than max_calib_seq_len, then concatenates and splits.
    pieces = [CALIBRATION[i:i + 150] for i in range(0, 150 * 16, 150)]
    model.quantize(tokenizer, quant_config=quant_config, calib_data=pieces,
                   max_calib_seq_len=64, max_calib_samples=4, n_parallel_calib_samples=None,
                   apply_clip=False)
    model.save_quantized(str(out))
    tokenizer.save_pretrained(out)
    state = {}
    for file in sorted(out.glob("*.safetensors")):
        state.update(load_file(str(file)))
    dense = {}
    for key in state:
        if key.endswith(".qweight"):
            module = key[:-len(".qweight")]
            weight = dequantize_gemm(state[key], state[module + ".qzeros"],
                                     state[module + ".scales"].float(), 4, group_size)
            dense[module] = weight.t().float().contiguous()  # [K, N] -> [N, K]
    (out / "reference").mkdir(exist_ok=True)
    save_file(dense, str(out / "reference" / "dequantized.safetensors"))


def main() -> None:
    kind, model_dir, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    torch.set_num_threads(1)
    out.mkdir(parents=True, exist_ok=True)
    if kind == "awq-gemm":
        autoawq_run(model_dir, out, group_size=int(sys.argv[4]) if len(sys.argv) > 4 else 64)
    else:
        llmcompressor_run(kind, model_dir, out)


if __name__ == "__main__":
    main()
