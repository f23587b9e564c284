"""Run inside the quantization-libraries venv (see libraries.py), never imported by tamis.

    python library_quantize.py KIND MODEL_DIR OUT_DIR

KIND: ct-w4a16 | ct-gptq-w4a16 | ct-fp8-dynamic (llm-compressor 0.14) | awq-gemm (AutoAWQ
0.2.9) | moe-ct-w4a16 | moe-ct-gptq-w4a16 | moe-ct-fp8-dynamic | moe-ct-int8-w8a8
(llm-compressor 0.14 on a mixture-of-experts model) | moe-all (each moe-* kind into
OUT_DIR/<kind>, in one process: importing the libraries is most of a run). Quantizes the
tiny model with that library, saves the checkpoint to OUT_DIR, then dequantizes every
quantized linear with the library's own code and saves those dense weights to
OUT_DIR/reference/dequantized.safetensors (outside the checkpoint) ({module name: float32
[N, K]}); that file is written last, so its presence marks a finished run.

The moe-* kinds quantize every decoder linear, each expert's projections included (the
library splits the fused experts of transformers 5 into one linear per expert), group 32
for W4A16 (the tiny experts' K is 32), and leave the routers and lm_head dense with the
library's own ignore idioms. They also load the written checkpoint back with transformers +
compressed-tensors (llm-compressor's ``load_context``) and save, in
OUT_DIR/reference/transformers.pt, its decompressed decoder linears ("weights") and the
logits and greedy continuations of ``MOE_PROMPTS`` ({"logits", "greedy"}) with the
activations handled three ways:

  library         as compressed-tensors runs the checkpoint (its activation emulation)
  weights_only    quantization disabled: the decompressed weights, fp32 activations
  int8_per_token  (int8-activation schemes) weights_only with each quantized linear's
                  input rounded per token to amax / 127, vLLM's dynamic W8A8
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

CALIBRATION = ("Calibration text for the cross-library test: weights are rounded to a grid; "
               "the library picks scales from activations it observes on this text. ") * 40


# Token ids of the prompts the MoE references run (any ids of the tiny models' vocabulary).
MOE_PROMPTS = [list(range(300, 301)), list(range(1000, 1009)), list(range(5000, 5040, 2))]
MOE_GREEDY_TOKENS = 8
# llm-compressor's MoE examples keep the routers dense: Qwen-MoE's "mlp.gate", Mixtral's
# "block_sparse_moe.gate" (transformers 5 calls it "mlp.gate" in the module tree).
MOE_IGNORE = ["lm_head", "re:.*mlp.gate$", "re:.*block_sparse_moe.gate$"]
MOE_KINDS = ("moe-ct-w4a16", "moe-ct-gptq-w4a16", "moe-ct-fp8-dynamic", "moe-ct-int8-w8a8")


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


def _int4_group32():
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    return {"group_0": QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(
        num_bits=4, type="int", symmetric=True, strategy="group", group_size=32))}


def _moe_recipe(kind: str):
    from llmcompressor.modifiers.gptq import GPTQModifier
    from llmcompressor.modifiers.quantization import QuantizationModifier

    if kind == "moe-ct-w4a16":
        return QuantizationModifier(config_groups=_int4_group32(), ignore=MOE_IGNORE)
    if kind == "moe-ct-gptq-w4a16":
        return GPTQModifier(config_groups=_int4_group32(), ignore=MOE_IGNORE)
    if kind == "moe-ct-fp8-dynamic":
        return QuantizationModifier(targets="Linear", scheme="FP8_DYNAMIC", ignore=MOE_IGNORE)
    if kind == "moe-ct-int8-w8a8":
        return QuantizationModifier(targets="Linear", scheme="W8A8", ignore=MOE_IGNORE)
    raise SystemExit(f"unknown kind {kind!r}")


def _hide_unimportable_transformers_aliases() -> None:
    """transformers 5.17's class patching (which llm-compressor's MoE loading uses) lists
    every transformers module, importing its legacy alias modules; the image-processing
    ones need torchvision, absent here. Dropping those aliases leaves the rest intact."""
    for name, module in list(sys.modules.items()):
        if name.startswith("transformers") and getattr(module, "__file__", "") is None:
            try:
                dir(module)
            except ImportError:
                del sys.modules[name]


def _load_moe(path, **kwargs):
    """``AutoModelForCausalLM.from_pretrained`` with llm-compressor's MoE loading: experts
    split into one linear per expert and projection. A saved Mixtral names those
    ``experts.<e>.{gate,up,down}_proj`` (not w1 / w3 / w2), which transformers' Mixtral
    mapping does not read: llm-compressor's ``patch_moe_mappings`` declares that layout."""
    import contextlib

    from llmcompressor.modeling import patch_moe_mappings
    from llmcompressor.utils import load_context
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.core_model_loading import WeightRenaming

    _hide_unimportable_transformers_aliases()
    layout = contextlib.nullcontext()
    if AutoConfig.from_pretrained(path).model_type == "mixtral" and "quantization_config" in \
            json.loads((Path(path) / "config.json").read_text()):
        renames = [WeightRenaming(source_patterns=rf"\.experts\.(\d+)\.{proj}\.",
                                  target_patterns=rf".experts.\1.{proj}.")
                   for proj in ("gate_proj", "up_proj", "down_proj")]
        layout = patch_moe_mappings("mixtral", renames, remove_targets=[
            ".experts.gate_up_proj", ".experts.down_proj"])
    with layout, load_context():
        return AutoModelForCausalLM.from_pretrained(path, **kwargs)


def llmcompressor_moe_run(kind: str, model_dir: str, out: Path) -> None:
    from llmcompressor import oneshot
    from transformers import AutoTokenizer

    model = _load_moe(model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    calibration = {}
    if kind == "moe-ct-gptq-w4a16":
        calibration = dict(dataset=_calibration_dataset(tokenizer), max_seq_length=64,
                           num_calibration_samples=4)
    oneshot(model=model, recipe=_moe_recipe(kind), **calibration)
    model.save_pretrained(out, save_compressed=True)
    tokenizer.save_pretrained(out)
    del model
    _transformers_reference(out)
    _ct_dequantize(out)


@torch.no_grad()
def _transformers_reference(out: Path) -> None:
    """The written checkpoint through transformers + compressed-tensors, fp32, with the
    activations handled the three ways the module docstring lists."""
    from compressed_tensors.quantization import disable_quantization

    model = _load_moe(out, dtype=torch.float32).eval()
    reference = {"library": _run_prompts(model)}
    # compressed-tensors decompresses on the first forward: the weights are read after it.
    reference["weights"] = {name: module.weight.detach().float().clone()
                            for name, module in model.named_modules()
                            if isinstance(module, torch.nn.Linear) and name != "lm_head"}
    int8_inputs = [module for module in model.modules()
                   if _input_args(module) is not None and _input_args(module).type == "int"]
    model.apply(disable_quantization)
    reference["weights_only"] = _run_prompts(model)
    if int8_inputs:
        hooks = [module.register_forward_pre_hook(_int8_per_token) for module in int8_inputs]
        reference["int8_per_token"] = _run_prompts(model)
        for hook in hooks:
            hook.remove()
    (out / "reference").mkdir(exist_ok=True)
    torch.save(reference, out / "reference" / "transformers.pt")


def _input_args(module):
    scheme = getattr(module, "quantization_scheme", None)
    return scheme.input_activations if scheme is not None else None


def _int8_per_token(module, args):
    """Each token's input rounded to the int8 grid of amax / 127 (vLLM's dynamic W8A8)."""
    x = args[0]
    scale = (x.abs().amax(dim=-1, keepdim=True) / 127.0).clamp(min=1e-10 / 127.0)
    return (torch.round(x / scale).clamp(-128, 127) * scale,) + tuple(args[1:])


def _run_prompts(model) -> dict:
    """{"logits": [T, V] per prompt of MOE_PROMPTS, "greedy": its greedy continuation}."""
    logits, greedy = [], []
    for prompt in MOE_PROMPTS:
        ids = torch.tensor([prompt])
        logits.append(model(ids).logits[0].float())
        tokens = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                max_new_tokens=MOE_GREEDY_TOKENS,
                                min_new_tokens=MOE_GREEDY_TOKENS, pad_token_id=0)
        greedy.append(tokens[0, len(prompt):].tolist())
    return {"logits": logits, "greedy": greedy}


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
    elif kind in MOE_KINDS:
        llmcompressor_moe_run(kind, model_dir, out)
    elif kind == "moe-all":
        for moe_kind in MOE_KINDS:
            if not (out / moe_kind / "reference" / "dequantized.safetensors").exists():
                llmcompressor_moe_run(moe_kind, model_dir, out / moe_kind)
    else:
        llmcompressor_run(kind, model_dir, out)


if __name__ == "__main__":
    main()
