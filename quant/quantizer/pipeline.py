"""`tamis quantize`: one model folder in, one quantized checkpoint folder out.

```
load (transformers, fp32) -> calibration windows -> layer 0 inputs
for each decoder layer:                                  (a progress bar step per layer)
    replay -> inputs of every linear (GPTQ: Hessians; AWQ: activations)
    quantize its linears (GPTQ solve | AWQ scale search + fold + RTN | RTN | FP8)
    put the dequantized weights back, replay -> inputs of the next layer
write safetensors + config.json quantization_config (quant/quantizer/writer.py)
```
``quantize_checkpoint`` returns a ``QuantizeResult`` holding each quantized linear and
the model with its dequantized weights in place: the reference the round-trip tests and
the perplexity benchmark compare against.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from tamis.quant.quantizer import awq as awq_search
from tamis.quant.quantizer import calibration, writer
from tamis.quant.quantizer.fp8 import Fp8Weight, gptq_fp8, rtn_fp8
from tamis.quant.quantizer.gptq import HessianAccumulator, gptq_quantize
from tamis.quant.quantizer.grid import QuantizedWeight, rtn_quantize

METHODS = ("awq", "gptq", "fp8")
BITS = {"awq": (4,), "gptq": (4, 8), "fp8": (8,)}
GROUP_SIZES = {"awq": (32, 64, 128), "gptq": (-1, 32, 64, 128), "fp8": (-1,)}
AWQ_ROWS = 512  # calibration rows (evenly spaced) the AWQ scale-search loss is measured on


@dataclass
class QuantizeOptions:
    method: str
    bits: int | None = None
    group_size: int = 128
    desc_act: bool = False
    sym: bool | None = None
    rtn: bool = False
    calibration_text: str | None = None
    num_samples: int = 16
    seq_len: int = 512
    damp: float = 0.01
    # GPTQ: re-collect each stage's inputs through the stages already quantized in the
    # layer (q/k/v, o, gate/up, down) instead of one replay of the unquantized layer.
    true_sequential: bool = False
    # GPTQ group grids / AWQ final rounding: clipping search on the output error under
    # the Hessian block of each group (AutoAWQ's clip loss), not the (diagonal) weight error.
    output_clip: bool = False
    static_groups: bool = False  # GPTQ act-order: grids fitted before the permutation
    awq_gptq: bool = False  # AWQ: round the scaled weights with GPTQ instead of RTN

    def __post_init__(self):
        if self.method not in METHODS:
            raise ValueError(f"--method {self.method!r}: choose one of {METHODS}")
        if self.bits is None:
            self.bits = 8 if self.method == "fp8" else 4
        if self.bits not in BITS[self.method]:
            raise ValueError(f"--bits {self.bits} is not supported for {self.method}: "
                             f"choose one of {BITS[self.method]}")
        if self.method == "fp8":
            self.group_size = -1
        elif self.group_size not in GROUP_SIZES[self.method]:
            raise ValueError(f"--group-size {self.group_size} is not supported for "
                             f"{self.method}: choose one of {GROUP_SIZES[self.method]}")
        if self.sym is None:
            self.sym = self.method != "awq"
        if self.method == "awq" and self.sym:
            raise ValueError("--sym: AWQ's GEMM format stores zero points (asymmetric); "
                             "use --no-sym or --method gptq")
        if self.desc_act and (self.method != "gptq" or self.rtn):
            raise ValueError("--desc-act needs --method gptq without --rtn")


@dataclass
class QuantizeResult:
    weights: dict[str, QuantizedWeight | Fp8Weight] = field(default_factory=dict)
    reference_model: nn.Module | None = None  # transformers model, dequantized weights


def quantize_checkpoint(model_path: str | Path, output: str | Path, options: QuantizeOptions,
                        progress: bool = True,
                        samples: list[torch.Tensor] | None = None) -> QuantizeResult:
    """Quantizes the model at ``model_path`` into ``output``. ``samples`` (token id
    windows) replace tokenizing ``options.calibration_text``."""
    from transformers import AutoModelForCausalLM

    model_path, output = Path(model_path), Path(output)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    layers = calibration.decoder_layers(model)
    _check_shapes(layers, options)
    result = QuantizeResult(reference_model=model)
    bar = _progress(len(layers), f"{options.method} {options.bits}-bit", progress)
    if options.rtn:
        for index, layer in enumerate(layers):
            _quantize_layer_rtn(layer, f"model.layers.{index}", options, result)
            bar.update(1)
    else:
        if samples is None:
            samples = _calibration_samples(model_path, options)
        inputs, kwargs = calibration.capture_layer_inputs(model, samples)
        for index, layer in enumerate(layers):
            quantize = _quantize_layer_awq if options.method == "awq" else _quantize_layer_gptq
            quantize(layer, f"model.layers.{index}", inputs, kwargs, options, result)
            inputs = calibration.run_layer(layer, inputs, kwargs)
            bar.update(1)
    bar.close()
    state = _checkpoint_state(model, result, options)
    quant_config = writer.quantization_config(options.method, options.bits, options.group_size,
                                              options.desc_act, options.sym)
    writer.write_checkpoint(model_path, output, state, quant_config)
    return result


def _calibration_samples(model_path: Path, options: QuantizeOptions) -> list[torch.Tensor]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    text = options.calibration_text or calibration.default_calibration_text()
    return calibration.calibration_samples(tokenizer, text, options.num_samples, options.seq_len)


def _progress(total: int, desc: str, enabled: bool):
    from tqdm import tqdm
    return tqdm(total=total, desc=f"quantize ({desc})", unit="layer", disable=not enabled)


def _linears(layer: nn.Module) -> dict[str, nn.Linear]:
    return {name: m for name, m in layer.named_modules() if isinstance(m, nn.Linear)}


def _check_shapes(layers: nn.ModuleList, options: QuantizeOptions) -> None:
    """Rejects shapes the chosen format cannot store, naming the layer."""
    pack = 32 // options.bits if options.method != "fp8" else 1
    for index, layer in enumerate(layers):
        for name, linear in _linears(layer).items():
            n, k = linear.weight.shape
            where = f"model.layers.{index}.{name}"
            if options.method == "awq" and (k % options.group_size or n % 8):
                raise ValueError(f"{where}: AWQ needs K divisible by the group size and N by 8 "
                                 f"(K={k}, N={n}, group {options.group_size})")
            if options.method == "gptq" and (k % pack or n % pack):
                raise ValueError(f"{where}: GPTQ {options.bits}-bit needs K and N divisible "
                                 f"by {pack} (K={k}, N={n})")


def _store(linear: nn.Linear, name: str, quantized, result: QuantizeResult) -> None:
    result.weights[name] = quantized
    linear.weight.data = quantized.dequantize().to(linear.weight.dtype)


def _quantize_layer_rtn(layer: nn.Module, prefix: str, options: QuantizeOptions,
                        result: QuantizeResult) -> None:
    for name, linear in _linears(layer).items():
        if options.method == "fp8":
            quantized = rtn_fp8(linear.weight.data)
        else:
            # No clipping search without calibration: on SmolLM2 the weight-MSE-optimal
            # clip lowered weight error 7% but raised perplexity (outlier weights matter).
            quantized = rtn_quantize(linear.weight.data, options.bits, options.group_size,
                                     options.sym, min_zero=_min_zero(options), search=False)
        _store(linear, f"{prefix}.{name}", quantized, result)


def _min_zero(options: QuantizeOptions) -> int:
    # GPTQ v1 stores zero - 1, so an asymmetric zero point must be at least 1.
    return 1 if options.method == "gptq" and not options.sym else 0


def _quantize_layer_gptq(layer: nn.Module, prefix: str, inputs, kwargs,
                         options: QuantizeOptions, result: QuantizeResult) -> None:
    linears = _linears(layer)
    stages = _stages(linears)
    if not options.true_sequential:  # one replay of the layer before any is quantized
        hessians = _hessians(layer, inputs, kwargs, list(linears))
    for stage in stages:
        if options.true_sequential:  # this stage's inputs through the quantized stages
            hessians = _hessians(layer, inputs, kwargs, stage)
        if options.method == "fp8":  # one per-tensor scale per linear: solve them apart
            for name in stage:
                quantized = _gptq_linear(linears[name].weight.data, hessians[name], options)
                _store(linears[name], f"{prefix}.{name}", quantized, result)
            continue
        # The linears of a stage read one input, so share one Hessian, and GPTQ treats
        # output rows independently: one solve over their stacked rows gives each the
        # result of its own solve, in one pass over K instead of one per linear.
        weights = [linears[name].weight.data for name in stage]
        stacked = _gptq_linear(torch.cat(weights), hessians[stage[0]], options)
        for name, quantized in zip(stage, _split_rows(stacked, [w.shape[0] for w in weights])):
            _store(linears[name], f"{prefix}.{name}", quantized, result)


def _hessians(layer: nn.Module, inputs, kwargs, names: list[str]) -> dict[str, torch.Tensor]:
    accumulators = {name: HessianAccumulator(layer.get_submodule(name).in_features)
                    for name in names}
    calibration.collect_linear_inputs(layer, inputs, kwargs,
                                      lambda name, x: accumulators[name].add(x), names=names)
    return {name: acc.hessian for name, acc in accumulators.items()}


def _split_rows(quantized, rows: list[int]) -> list:
    """The per-linear parts of a quantized stack of linears (rows = output features)."""
    if len(rows) == 1:
        return [quantized]
    if isinstance(quantized, Fp8Weight):
        raise ValueError("FP8 stacks share one per-tensor scale: quantize them apart")
    return [QuantizedWeight(c.contiguous(), s.contiguous(), z.contiguous(),
                            quantized.g_idx.clone(),  # safetensors refuses shared tensors
                            quantized.bits, quantized.group_size)
            for c, s, z in zip(quantized.codes.split(rows), quantized.scales.split(rows),
                               quantized.zeros.split(rows))]


# The order a Llama-style layer reads its linears in; linears of one stage share an input.
_STAGES = (("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), ("self_attn.o_proj",),
           ("mlp.gate_proj", "mlp.up_proj"), ("mlp.down_proj",))


def _stages(linears: dict[str, nn.Linear]) -> list[list[str]]:
    """True-sequential stages; a layer with other linears is one stage."""
    known = [name for stage in _STAGES for name in stage]
    if sorted(known) != sorted(linears):
        return [list(linears)]
    return [list(stage) for stage in _STAGES]


def _gptq_linear(weight: torch.Tensor, hessian: torch.Tensor, options: QuantizeOptions,
                 sym: bool | None = None, act_order: bool | None = None, min_zero=None):
    if options.method == "fp8":  # no groups: act-order changes nothing in the format
        return gptq_fp8(weight, hessian, act_order=True, damp=options.damp)
    return gptq_quantize(weight, hessian, options.bits, options.group_size,
                         options.sym if sym is None else sym,
                         options.desc_act if act_order is None else act_order,
                         damp=options.damp,
                         min_zero=_min_zero(options) if min_zero is None else min_zero,
                         weighted_clip=options.output_clip,
                         static_groups=options.static_groups)


def _quantize_layer_awq(layer: nn.Module, prefix: str, inputs, kwargs,
                        options: QuantizeOptions, result: QuantizeResult) -> None:
    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    needed = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    if attn is None or mlp is None or not all(
            hasattr(attn, n) or hasattr(mlp, n) for n in needed):
        raise ValueError(f"{prefix}: AWQ scale search supports Llama-style layers "
                         f"(self_attn.q/k/v/o_proj, mlp.gate/up/down_proj)")
    seen: dict[str, list[torch.Tensor]] = {}
    hessians: dict[str, HessianAccumulator] = {}

    def on_input(name: str, x: torch.Tensor) -> None:
        seen.setdefault(name, []).append(x)
        if options.output_clip or options.awq_gptq:
            hessians.setdefault(name, HessianAccumulator(x.shape[-1])).add(x)

    calibration.collect_linear_inputs(layer, inputs, kwargs, on_input)
    x = {name: _subsample(torch.cat(chunks)) for name, chunks in seen.items()}
    bits, group = options.bits, options.group_size
    scaled = {}  # linear name -> s its input was divided by
    with torch.no_grad():
        qkv = [attn.q_proj, attn.k_proj, attn.v_proj]
        s = awq_search.search_scales(x["self_attn.q_proj"], [m.weight for m in qkv], bits, group)
        _fold(layer.input_layernorm.weight, s, qkv)
        scaled.update(dict.fromkeys(("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), s))
        if attn.v_proj.out_features == attn.o_proj.in_features:  # no GQA: v rows feed o
            s = awq_search.search_scales(x["self_attn.o_proj"], [attn.o_proj.weight], bits, group)
            _fold_linear(attn.v_proj, s, attn.o_proj)
            scaled["self_attn.o_proj"] = s
        gate_up = [mlp.gate_proj, mlp.up_proj]
        s = awq_search.search_scales(x["mlp.gate_proj"], [m.weight for m in gate_up], bits, group)
        _fold(layer.post_attention_layernorm.weight, s, gate_up)
        scaled.update(dict.fromkeys(("mlp.gate_proj", "mlp.up_proj"), s))
        s = awq_search.search_scales(x["mlp.down_proj"], [mlp.down_proj.weight], bits, group)
        _fold_linear(mlp.up_proj, s, mlp.down_proj)
        scaled["mlp.down_proj"] = s
    for name, linear in _linears(layer).items():
        s = scaled.get(name)
        if name in hessians:  # the Hessian of the scaled inputs x / s
            h = hessians[name].hessian
            hessian = h if s is None else h / (s[:, None] * s[None, :]).to(h.dtype)
        if options.awq_gptq:  # contiguous groups, zero points >= 0: AWQ GEMM-storable
            quantized = _gptq_linear(linear.weight.data, hessian, options, sym=False,
                                     act_order=False, min_zero=0)
        elif options.output_clip:
            quantized = rtn_quantize(linear.weight.data, bits, group, sym=False, hessian=hessian)
        else:
            # Clipping search weighted by the mean square of the (scaled) inputs: the
            # diagonal of the output-error loss AutoAWQ's clip search measures.
            inputs_seen = x[name] / (torch.ones(()) if s is None else s)
            quantized = rtn_quantize(linear.weight.data, bits, group, sym=False,
                                     importance=inputs_seen.float().pow(2).mean(dim=0))
        _store(linear, f"{prefix}.{name}", quantized, result)


def _subsample(x: torch.Tensor) -> torch.Tensor:
    if x.shape[0] <= AWQ_ROWS:
        return x
    return x[torch.linspace(0, x.shape[0] - 1, AWQ_ROWS).long()]


def _fold(norm_weight: torch.Tensor, s: torch.Tensor, linears: list[nn.Linear]) -> None:
    norm_weight.div_(s)
    for linear in linears:
        linear.weight.mul_(s[None, :])


def _fold_linear(previous: nn.Linear, s: torch.Tensor, linear: nn.Linear) -> None:
    previous.weight.div_(s[:, None])
    if previous.bias is not None:
        previous.bias.div_(s)
    linear.weight.mul_(s[None, :])


def _checkpoint_state(model: nn.Module, result: QuantizeResult,
                      options: QuantizeOptions) -> dict[str, torch.Tensor]:
    state = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
    if getattr(model.config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    pack = {"awq": writer.awq_tensors, "gptq": writer.gptq_tensors}.get(options.method)
    for name, quantized in result.weights.items():
        del state[f"{name}.weight"]
        if options.method == "fp8":
            state.update(writer.fp8_tensors(name, quantized.weight, quantized.scale))
        else:
            state.update(pack(name, quantized))
    return state
