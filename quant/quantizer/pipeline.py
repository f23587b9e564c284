"""`tamis quantize`: one model folder in, one quantized checkpoint folder out.

```
load (transformers, fp32) -> optionally rotate the residual stream (rotate.py)
    -> calibration windows -> layer 0 inputs
for each decoder layer:                                  (a progress bar step per layer)
    replay -> inputs of every linear (GPTQ: Hessians; AWQ: activations)
    quantize its linears (GPTQ solve | AWQ scale search + fold + GPTQ solve (or RTN)
        | RTN | FP8),
        then optionally refit the scales / descend on the codes (refit.py, descent.py)
    put the dequantized weights back, replay -> inputs of the next layer
write safetensors + config.json quantization_config (quant/quantizer/writer.py)
```
The model is loaded into host memory and stays there; each decoder layer is moved to
``QuantizeOptions.device`` for its turn and back (device.py: what is kept where, peak
device memory). Rotation and the embedding of the calibration windows run there too.
``quantize_checkpoint`` returns a ``QuantizeResult`` holding each quantized linear and
the model with its dequantized weights in place: the reference the round-trip tests and
the perplexity benchmark compare against.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from tamis.quant.quantizer import awq as awq_search
from tamis.quant.quantizer import calibration, writer
from tamis.quant.quantizer.device import activation_home, onloaded, resolve_device
from tamis.quant.quantizer.fp8 import Fp8Weight, gptq_fp8, rtn_fp8
from tamis.quant.quantizer.descent import descend_codes
from tamis.quant.quantizer.gptq import HessianAccumulator, gptq_quantize, one_thread
from tamis.quant.quantizer.grid import QuantizedWeight, rtn_quantize
from tamis.quant.quantizer.refit import refit_scales
from tamis.quant.quantizer.rotate import (SUPPORTED_MODEL_TYPES, rotate_residual,
                                          supports_rotation)

METHODS = ("awq", "gptq", "fp8")
BITS = {"awq": (4,), "gptq": (4, 8), "fp8": (8,)}
GROUP_SIZES = {"awq": (32, 64, 128), "gptq": (-1, 32, 64, 128), "fp8": (-1,)}


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
    # The options below left as None take the method's default (``DEFAULTS``).
    # GPTQ group grids / AWQ final rounding: clipping search on the output error under
    # the Hessian block of each group (AutoAWQ's clip loss), not the (diagonal) weight error.
    output_clip: bool | None = None
    # GPTQ: fit each group's grid by the clipping search (``grid.fit_grid``); off, the grid
    # covers the group's [min, max] (GPTQ's and llm-compressor's minmax observer).
    clip_search: bool = True
    # GPTQ: visit columns in act order (decreasing Hessian diagonal) with groups kept
    # contiguous in K, their grids fitted before the solve; g_idx stays column // group,
    # so without --desc-act the checkpoint is a plain (non act-order) one.
    static_groups: bool | None = None
    # GPTQ --desc-act: act order over runs of this many contiguous columns (1: GPTQ's
    # column act order); dynamic groups are then unions of whole runs. None: a quarter
    # of the group, at most 32, with asymmetric dynamic groups; else 1
    # (``_default_act_order_block``).
    act_order_block: int | None = None
    # GPTQ --desc-act (dynamic groups): fit each group's grid before the solve on the
    # original weights of its columns (as static groups do), not on the error-updated ones.
    prefit_grids: bool = False
    # GPTQ: rounds of (least-squares refit of the scales for the codes found, GPTQ again
    # with those grids held), then a last refit (refit.py); 0: GPTQ's own grids.
    refine: int | None = None
    # A last least-squares refit of the scales for the final codes (refit.py); None: on
    # when ``refine`` is (the refit that ends each refine round).
    refit: bool | None = None
    descent: int | None = None  # rounds of (coordinate descent on the codes, refit)
    # AWQ: round the scaled weights with GPTQ (default; static groups, refine 1) instead
    # of RTN (AutoAWQ's rounding: --no-awq-gptq).
    awq_gptq: bool | None = None
    awq_scales: bool = False  # GPTQ: fold AWQ's scale search into the layer before GPTQ
    # Rotate the residual stream before quantizing (rotate.py: same function, weights
    # spread over every channel; the checkpoint's embeddings come untied). None: the
    # method's default (on for calibrated GPTQ).
    rotate: bool | None = None
    # The checkpoint layout (writer.py): "native" (AWQ GEMM / GPTQ v1) or
    # "compressed-tensors" (pack-quantized; float-quantized, the only FP8 layout).
    # None: native for awq and gptq, compressed-tensors for fp8.
    format: str | None = None
    # Where the layers are quantized (device.py): "auto" (CUDA when there is a GPU, else
    # the CPU), "cpu", "cuda" or "cuda:N".
    device: str = "auto"
    # Set by __post_init__: rotate is the method's default, not asked for. A default
    # rotation is skipped on an architecture rotate.py does not know; an asked-for one
    # is refused there.
    rotate_by_default: bool = field(default=False, init=False)
    compute_device: torch.device = field(default=None, init=False)  # ``device`` resolved

    def __post_init__(self):
        self.rotate_by_default = self.rotate is None
        self.compute_device = resolve_device(self.device)
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
        if self.format is None:
            self.format = "compressed-tensors" if self.method == "fp8" else "native"
        if self.format not in writer.FORMATS:
            raise ValueError(f"--format {self.format!r}: choose one of {writer.FORMATS}")
        if self.method == "fp8" and self.format != "compressed-tensors":
            raise ValueError("--method fp8 writes the compressed-tensors format only (the "
                             "layout vLLM and transformers both read)")
        if self.sym is None:
            self.sym = self.method != "awq"
        if self.method == "awq" and self.sym:
            raise ValueError("--sym: AWQ's GEMM format stores zero points (asymmetric); "
                             "use --no-sym or --method gptq")
        if self.awq_gptq is None:
            self.awq_gptq = self.method == "awq" and not self.rtn
        if self.awq_scales and (self.method != "gptq" or self.rtn):
            raise ValueError("--awq-scales needs --method gptq without --rtn")
        if self.desc_act and (self.method != "gptq" or self.rtn):
            raise ValueError("--desc-act needs --method gptq without --rtn")
        if self.static_groups and (self.rtn or not (self.method == "gptq" or self.awq_gptq)):
            raise ValueError("--static-groups needs a GPTQ solve: --method gptq without "
                             "--rtn, or --method awq --awq-gptq")
        if self.act_order_block is None:
            self.act_order_block = _default_act_order_block(self)
        if self.act_order_block != 1 and not (self.method == "gptq" and self.desc_act):
            raise ValueError("--act-order-block needs --method gptq --desc-act")
        if self.act_order_block < 1 or (self.group_size != -1
                                        and self.group_size % self.act_order_block):
            raise ValueError(f"--act-order-block {self.act_order_block} must divide the "
                             f"group size {self.group_size}")
        if self.prefit_grids and not (self.method == "gptq" and self.desc_act
                                      and not self.rtn):
            raise ValueError("--prefit-grids needs --method gptq --desc-act")
        if self.awq_gptq and self.method != "awq":
            raise ValueError("--awq-gptq needs --method awq")
        if self.awq_gptq and self.rtn:
            raise ValueError("--awq-gptq needs calibration: drop --rtn")
        for name, value in DEFAULTS[self.method](self).items():
            if getattr(self, name) is None:
                setattr(self, name, value)
        if self.refit and (self.rtn or self.method == "fp8"):
            raise ValueError("--refit needs calibration and an integer grid: "
                             "--method gptq or awq without --rtn")
        if self.refit is None:
            self.refit = bool(self.refine) and not self.rtn and self.method != "fp8"
        if self.format == "compressed-tensors" and self.desc_act and not self.static_groups:
            raise ValueError("--desc-act with --format compressed-tensors needs "
                             "--static-groups (actorder 'weight'): compressed-tensors 0.19 "
                             "no longer reads dynamic act-order groups (actorder 'group'); "
                             "the native GPTQ format keeps them")


def _default_act_order_block(options: QuantizeOptions) -> int:
    """Asymmetric dynamic act-order groups (gptq --desc-act --no-sym without
    --static-groups) order runs of a quarter group (at most 32 columns: 32 at group 128
    or -1), so each group is a union of four or more runs; everything else visits single
    columns. On SmolLM2 at g128 (issue 5, bench/results/quant.md) asymmetric runs of 32
    plus one refine round beat per-column act order by 2.3-3.2 points of perplexity at
    three calibration sizes; symmetric grids had no consistent winner (runs of 32 + refine
    1.5 points better at 16 x 512, 2.2 worse at 32 x 512), so they keep GPTQ's order."""
    if (options.method != "gptq" or not options.desc_act or options.rtn or options.sym
            or options.static_groups):
        return 1
    return 32 if options.group_size == -1 else min(32, options.group_size // 4)


def _defaults_gptq(options: QuantizeOptions) -> dict:
    # Chosen on SmolLM2-135M (bench/results/quant.md, issue 5): the output-error clip,
    # act-order visiting with static groups when the format has no act-order, and one
    # refit round each lowered perplexity. Dynamic act-order groups get the refine round
    # only over runs of columns with an asymmetric grid: with per-column act order, and
    # symmetric runs of 32 at 16 x 512 and 32 x 512, it raised perplexity.
    static = options.static_groups
    if static is None:
        static = not (options.desc_act or options.rtn)
    runs = options.desc_act and options.act_order_block > 1 and not options.sym
    # Rotating the residual stream lowered all four GPTQ g128 rows on SmolLM2 at 16 x 512
    # (sym +11.5% -> +9.6%, sym act order +14.8% -> +8.5%, asym +9.6% -> +8.7%, asym act
    # order +9.2% -> +7.5%; bench/results/quant.md).
    return dict(output_clip=not options.rtn, static_groups=static,
                refine=1 if static or runs else 0, descent=0, rotate=not options.rtn)


def _defaults_awq(options: QuantizeOptions) -> dict:
    # GPTQ rounding of the AWQ-scaled weights with static groups and one refit round:
    # SmolLM2 AWQ g64 at 16 x 512 calibration +8.4% against RTN's +12.2% (issue 5).
    static = options.awq_gptq if options.static_groups is None else options.static_groups
    return dict(output_clip=True, static_groups=static, refine=1 if static else 0, descent=0,
                rotate=False)


def _defaults_fp8(options: QuantizeOptions) -> dict:
    return dict(output_clip=False, static_groups=False, refine=0, descent=0, rotate=False)


DEFAULTS = {"gptq": _defaults_gptq, "awq": _defaults_awq, "fp8": _defaults_fp8}


@dataclass
class QuantizeResult:
    weights: dict[str, QuantizedWeight | Fp8Weight] = field(default_factory=dict)
    reference_model: nn.Module | None = None  # transformers model, dequantized weights


def quantize_checkpoint(model_path: str | Path, output: str | Path, options: QuantizeOptions,
                        progress: bool = True,
                        samples: list[torch.Tensor] | None = None) -> QuantizeResult:
    """Quantizes the model at ``model_path`` into ``output`` on ``options.device``.
    ``samples`` (token id windows) replace tokenizing ``options.calibration_text``. The
    result's weights and reference model are in host memory."""
    from transformers import AutoModelForCausalLM

    model_path, output = Path(model_path), Path(output)
    _check_source_files(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    rotated = _rotate(model, options)
    layers = calibration.decoder_layers(model)
    _check_shapes(layers, options)
    result = QuantizeResult(reference_model=model)
    bar = _progress(len(layers), f"{options.method} {options.bits}-bit", progress)
    device = options.compute_device
    if options.rtn:
        for index, layer in enumerate(layers):
            with onloaded([layer], device):
                _quantize_layer_rtn(layer, f"model.layers.{index}", options, result)
            bar.update(1)
    else:
        if samples is None:
            samples = _calibration_samples(model_path, options)
        home = activation_home(device, _activation_bytes(model, samples))
        inputs, kwargs = calibration.capture_layer_inputs(model, samples, device, home)
        for index, layer in enumerate(layers):
            with onloaded([layer], device):
                _quantize_layer(layer, f"model.layers.{index}", inputs, kwargs, options,
                                result)
                inputs = calibration.run_layer(layer, inputs, kwargs)
            bar.update(1)
    bar.close()
    dtype = writer.checkpoint_dtype(model_path)
    state = writer.checkpoint_state(
        model, result.weights, options.method, options.format, options.sym, dtype)
    quant_config = writer.quantization_config(
        options.method, options.bits, options.group_size, options.desc_act, options.sym,
        static_groups=bool(options.static_groups), true_sequential=options.true_sequential,
        damp=options.damp, fmt=options.format)
    overrides = writer.dtype_override(model_path, dtype)
    if rotated:
        overrides["tie_word_embeddings"] = False
    writer.write_checkpoint(model_path, output, state, quant_config, overrides)
    return result


def _activation_bytes(model: nn.Module, samples: list[torch.Tensor]) -> int:
    """The size of one layer's inputs (float32 hidden states of every window)."""
    return sum(s.numel() for s in samples) * model.config.hidden_size * 4


def _check_source_files(model_path: Path) -> None:
    """A truncated safetensors shard is a one-line ValueError naming it, before
    transformers' loader meets it (its error is a deep traceback without the file)."""
    from tamis.engine.loader import check_safetensors_files

    if any(model_path.glob("*.safetensors")):
        check_safetensors_files(model_path)


def _rotate(model: nn.Module, options: QuantizeOptions) -> bool:
    """Rotates ``model``'s residual stream where ``options`` say so (rotate.py); whether
    it did. The default skips, with a notice, an architecture rotate.py does not know."""
    if not options.rotate:
        return False
    if options.rotate_by_default and not supports_rotation(model.config):
        print(f"tamis quantize: not rotating a {getattr(model.config, 'model_type', None)!r} "
              f"model (--rotate supports {', '.join(SUPPORTED_MODEL_TYPES)})", file=sys.stderr)
        return False
    rotate_residual(model, device=options.compute_device)
    return True


def _quantize_layer(layer: nn.Module, prefix: str, inputs, kwargs, options: QuantizeOptions,
                    result: QuantizeResult) -> None:
    """Quantizes one decoder layer in place (calibrated methods)."""
    if options.method == "awq" or options.awq_scales:
        _awq_fold(layer, prefix, inputs, kwargs, options)
        if options.method == "awq" and not options.awq_gptq:
            _quantize_layer_awq_rtn(layer, prefix, inputs, kwargs, options, result)
            return
    _quantize_layer_gptq(layer, prefix, inputs, kwargs, options, result)


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
    """Records ``quantized`` (in host memory) and puts its dequantized weight in place."""
    result.weights[name] = quantized.to("cpu")
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
    native_gptq = options.method == "gptq" and options.format == "native"
    return 1 if native_gptq and not options.sym else 0


def _quantize_layer_gptq(layer: nn.Module, prefix: str, inputs, kwargs,
                         options: QuantizeOptions, result: QuantizeResult) -> None:
    linears = _linears(layer)
    stages = _stages(linears)
    # The linears of a stage read one input, so share one Hessian (collected once, on the
    # stage's first linear), and GPTQ treats output rows independently: one solve over
    # their stacked rows gives each the result of its own solve, in one pass over K
    # instead of one per linear.
    if not options.true_sequential:  # one replay of the layer before any is quantized
        hessians = _hessians(layer, inputs, kwargs, [stage[0] for stage in stages])
    for stage in stages:
        if options.true_sequential:  # this stage's inputs through the quantized stages
            hessians = _hessians(layer, inputs, kwargs, stage[:1])
        weights = [linears[name].weight.data for name in stage]
        stacked = _gptq_linear(torch.cat(weights), hessians[stage[0]], options)
        for name, quantized in zip(stage, _split_rows(stacked, [w.shape[0] for w in weights])):
            _store(linears[name], f"{prefix}.{name}", quantized, result)


def _hessians(layer: nn.Module, inputs, kwargs, names: list[str]) -> dict[str, torch.Tensor]:
    accumulators = {name: HessianAccumulator(layer.get_submodule(name).in_features,
                                             layer.get_submodule(name).weight.device)
                    for name in names}
    calibration.collect_linear_inputs(layer, inputs, kwargs,
                                      lambda name, x: accumulators[name].add(x), names=names)
    return {name: acc.hessian for name, acc in accumulators.items()}


def _split_rows(quantized, rows: list[int]) -> list:
    """The per-linear parts of a quantized stack of linears (rows = output features)."""
    if len(rows) == 1:
        return [quantized]
    if isinstance(quantized, Fp8Weight):
        return quantized.split_rows(rows)
    return [QuantizedWeight(c.contiguous(), s.contiguous(), z.contiguous(),
                            quantized.g_idx.clone(),  # safetensors refuses shared tensors
                            quantized.bits, quantized.group_size)
            for c, s, z in zip(quantized.codes.split(rows), quantized.scales.split(rows),
                               quantized.zeros.split(rows))]


# The order a Llama-style layer reads its linears in; linears of one stage share an input.
_STAGES = (("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), ("self_attn.o_proj",),
           ("mlp.gate_proj", "mlp.up_proj"), ("mlp.down_proj",))


def _stages(linears: dict[str, nn.Linear]) -> list[list[str]]:
    """True-sequential stages; in a layer with other linears, each linear is its own."""
    known = [name for stage in _STAGES for name in stage]
    if sorted(known) != sorted(linears):
        return [[name] for name in linears]
    return [list(stage) for stage in _STAGES]


def _gptq_linear(weight: torch.Tensor, hessian: torch.Tensor, options: QuantizeOptions):
    # Grid searches, solves and refits are many small ops: one thread runs them faster
    # than two that wait on each other (``one_thread``).
    with one_thread():
        return _gptq_linear_rounds(weight, hessian, options)


def _gptq_linear_rounds(weight: torch.Tensor, hessian: torch.Tensor,
                        options: QuantizeOptions):
    if options.method == "fp8":  # no groups: act-order changes nothing in the format
        return gptq_fp8(weight, hessian, act_order=True, damp=options.damp)
    # Static groups visit in act order whatever the format: their g_idx stays contiguous.
    arguments = dict(bits=options.bits, group_size=options.group_size, sym=options.sym,
                     act_order=options.desc_act or options.static_groups, damp=options.damp,
                     min_zero=_min_zero(options), search=options.clip_search,
                     weighted_clip=options.output_clip,
                     static_groups=options.static_groups,
                     act_order_block=options.act_order_block,
                     prefit=options.prefit_grids and not options.static_groups)
    quantized = gptq_quantize(weight, hessian, **arguments)
    for _ in range(options.refine):
        quantized = refit_scales(weight, hessian, quantized)
        quantized = gptq_quantize(weight, hessian, **arguments,
                                  grids=(quantized.scales, quantized.zeros))
    return _polish(weight, hessian, quantized, options)


def _polish(weight: torch.Tensor, hessian: torch.Tensor, quantized: QuantizedWeight,
            options: QuantizeOptions) -> QuantizedWeight:
    """A last refit of the scales (``refit``), and ``descent`` rounds of coordinate
    descent on the codes (each followed by a refit), under the damped Hessian."""
    if options.refit:
        quantized = refit_scales(weight, hessian, quantized)
    if options.descent:
        h = hessian.to(torch.float64)
        damped = h + options.damp * torch.mean(torch.diag(h)) * torch.eye(
            h.shape[0], dtype=h.dtype, device=h.device)
        for _ in range(options.descent):
            quantized = refit_scales(weight, damped, descend_codes(weight, damped, quantized))
    return quantized


def _awq_fold(layer: nn.Module, prefix: str, inputs, kwargs, options: QuantizeOptions) -> None:
    """AWQ's scale search on the layer's calibration inputs, folded into the layer (same
    function; its linears then read x / s and are quantized as such)."""
    awq_search.check_layer(layer, prefix)  # before sampling rows the layout may not have
    seen: dict[str, awq_search.RowSample] = {}
    calibration.collect_linear_inputs(layer, inputs, kwargs,
                                      lambda name, x: _row_sample(seen, name, inputs).add(x))
    x = {name: sample.rows() for name, sample in seen.items()}
    awq_search.search_and_fold(layer, prefix, x, options.bits, options.group_size, options.sym)


def _row_sample(seen: dict, name: str, inputs: list[torch.Tensor]) -> awq_search.RowSample:
    """``seen[name]``, created on first use over every token of ``inputs`` (each linear of
    a Llama-style layer reads every token once)."""
    if name not in seen:
        seen[name] = awq_search.RowSample(sum(x.shape[:-1].numel() for x in inputs))
    return seen[name]


def _quantize_layer_awq_rtn(layer: nn.Module, prefix: str, inputs, kwargs,
                            options: QuantizeOptions, result: QuantizeResult) -> None:
    """Rounds the (already AWQ-scaled) linears of ``layer`` to nearest, with a clipping
    search weighted by their inputs (``output_clip``: by the Hessian block of each group),
    then ``refine`` / ``descent`` (``_polish``)."""
    seen: dict[str, awq_search.RowSample] = {}
    hessians: dict[str, HessianAccumulator] = {}
    need_hessian = options.output_clip or options.refit or options.descent

    def on_input(name: str, x: torch.Tensor) -> None:
        if not options.output_clip:
            _row_sample(seen, name, inputs).add(x)
        if need_hessian:
            hessians.setdefault(name, HessianAccumulator(x.shape[-1], x.device)).add(x)

    calibration.collect_linear_inputs(layer, inputs, kwargs, on_input)
    for name, linear in _linears(layer).items():
        weight = linear.weight.data
        if options.output_clip:
            quantized = rtn_quantize(weight, options.bits, options.group_size, sym=False,
                                     hessian=hessians[name].hessian)
        else:
            # Clipping search weighted by the mean square of the (scaled) inputs: the
            # diagonal of the output-error loss AutoAWQ's clip search measures.
            x = seen[name].rows()
            quantized = rtn_quantize(weight, options.bits, options.group_size, sym=False,
                                     importance=x.float().pow(2).mean(dim=0))
        if need_hessian:
            quantized = _polish(weight, hessians[name].hessian, quantized, options)
        _store(linear, f"{prefix}.{name}", quantized, result)
