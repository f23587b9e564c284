"""`tamis quantize [MODEL] --method awq|gptq|fp8 --output DIR`: write a quantized checkpoint.

No MODEL quantizes the embedded SmolLM2-135M-Instruct. GPTQ, AWQ and FP8 calibrate on
``--calibration-text`` (a text file; default: standard-library docstrings); ``--rtn``
skips calibration (round to nearest). FP8 has one weight scale per output channel and
dynamic per-token activations; its weights are rounded by GPTQ unless ``--rtn``.
Tensors that stay unquantized (embeddings, head, norms) are written in the source's
dtype when it is 16-bit, else in bfloat16.

The model is held in host memory; each decoder layer is quantized on --device in turn
(default auto: the GPU when torch sees one, else the CPU), so the GPU needs room for about
one layer, its Hessians and the calibration activations, not the whole model.

What is written, and what reads it:
  awq, gptq (--format native, the default): AWQ GEMM / GPTQ v1 layouts; load in tamis
      and vLLM (transformers reads them only through a separate AWQ / GPTQ backend).
  awq, gptq --format compressed-tensors: pack-quantized (W4A16 / W8A16); load in tamis,
      vLLM, and transformers with compressed-tensors installed.
  fp8: compressed-tensors float-quantized (llm-compressor's FP8_DYNAMIC layout); loads in
      tamis, vLLM, and transformers with compressed-tensors installed.

Examples:
  tamis quantize --method gptq --bits 4 --group-size 128 --desc-act --output smol-gptq
  tamis quantize --method gptq --no-sym --desc-act --static-groups --output smol-gptq-ao
  tamis quantize path/to/model --method awq --output model-awq
  tamis quantize --method gptq --format compressed-tensors --output smol-w4a16
  tamis quantize --method fp8 --output smol-fp8 && tamis serve smol-fp8
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("quantize", help="quantize a model (AWQ, GPTQ, FP8)",
                                   description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_tag", nargs="?", default=None, metavar="MODEL",
                        help="HF model folder (default: embedded SmolLM2)")
    parser.add_argument("--method", required=True, choices=("awq", "gptq", "fp8"))
    parser.add_argument("--output", required=True, help="folder to write the checkpoint into")
    parser.add_argument("--format", default=None, choices=("native", "compressed-tensors"),
                        help="checkpoint layout: native (AWQ GEMM / GPTQ v1; default for "
                             "awq and gptq) or compressed-tensors (pack-quantized; "
                             "float-quantized, the only one for fp8)")
    parser.add_argument("--bits", type=int, default=None, help="4 (awq, gptq), 8 (gptq, fp8)")
    parser.add_argument("--group-size", type=int, default=128,
                        help="input columns per scale: 32, 64, 128, or -1 for one per row (gptq)")
    parser.add_argument("--desc-act", action="store_true",
                        help="GPTQ act-order: quantize columns by decreasing activation energy")
    parser.add_argument("--sym", dest="sym", action="store_true", default=None,
                        help="symmetric grid (GPTQ default)")
    parser.add_argument("--no-sym", dest="sym", action="store_false",
                        help="asymmetric grid with zero points (AWQ always)")
    parser.add_argument("--rtn", action="store_true",
                        help="round to nearest, no calibration (gptq, fp8)")
    parser.add_argument("--calibration-text", default=None, metavar="FILE",
                        help="UTF-8 text file to calibrate on")
    parser.add_argument("--num-samples", type=int, default=16,
                        help="calibration windows (default 16)")
    parser.add_argument("--seq-len", type=int, default=512,
                        help="tokens per calibration window (default 512)")
    parser.add_argument("--true-sequential", action="store_true",
                        help="gptq: calibrate q/k/v, o, gate/up, down in turn, each through "
                             "the stages already quantized")
    parser.add_argument("--output-clip", action=argparse.BooleanOptionalAction, default=None,
                        help="clipping search on each group's output error (Hessian block), "
                             "not the weight error (gptq, awq; default on)")
    parser.add_argument("--clip-search", action=argparse.BooleanOptionalAction, default=True,
                        help="gptq: fit each group's grid by a clipping search (default on); "
                             "--no-clip-search: the group's min..max, as GPTQ does")
    parser.add_argument("--static-groups", action=argparse.BooleanOptionalAction, default=None,
                        help="gptq: visit columns in act order with groups contiguous in K, "
                             "grids fitted first (default on without --desc-act, where the "
                             "checkpoint stays a plain one; with --desc-act it is AutoGPTQ's "
                             "static_groups: g_idx = column // group)")
    parser.add_argument("--act-order-block", type=int, default=None, metavar="B",
                        help="gptq --desc-act: act order over runs of B contiguous columns "
                             "(B divides the group size; default with --no-sym: a quarter "
                             "group, at most 32, with --refine 1; else 1: GPTQ's per-column "
                             "act order)")
    parser.add_argument("--prefit-grids", action="store_true",
                        help="gptq --desc-act: fit each dynamic group's grid on the original "
                             "weights of its columns before the solve (as static groups do)")
    parser.add_argument("--refine", type=int, default=None, metavar="N",
                        help="gptq, awq: N rounds of least-squares scale refit + GPTQ with "
                             "those grids, then a last refit (default 1, but 0 with "
                             "--desc-act dynamic groups except asymmetric runs of columns "
                             "(--no-sym, --act-order-block above 1); 0 = off)")
    parser.add_argument("--refit", action=argparse.BooleanOptionalAction, default=None,
                        help="gptq, awq: a last least-squares refit of the scales for the "
                             "final codes (default: on when --refine is above 0)")
    parser.add_argument("--descent", type=int, default=None, metavar="N",
                        help="gptq, awq: N rounds of coordinate descent on the codes + "
                             "scale refit (default 0)")
    parser.add_argument("--awq-gptq", action=argparse.BooleanOptionalAction, default=None,
                        help="awq: round the scaled weights with GPTQ (static groups, "
                             "--refine 1; default on) instead of RTN (--no-awq-gptq)")
    parser.add_argument("--awq-scales", action="store_true",
                        help="gptq: fold AWQ's activation-aware scales into the layer "
                             "before GPTQ (the checkpoint stays a GPTQ one)")
    parser.add_argument("--rotate", action=argparse.BooleanOptionalAction, default=None,
                        help="rotate the residual stream before quantizing (QuaRot's R1, "
                             "offline: same function, outliers spread over every channel; "
                             "norm weights folded, embeddings untied; default: on for gptq "
                             "without --rtn)")
    parser.add_argument("--damp", type=float, default=None,
                        help="GPTQ Hessian damping, a fraction of its mean diagonal (0.01)")
    parser.add_argument("--device", default="auto", metavar="DEVICE",
                        help="where each layer is quantized: auto (cuda when available, "
                             "else cpu; the default), cpu, cuda or cuda:N")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    import torch

    from tamis.engine.embedded import default_model_path
    from tamis.quant.quantizer.pipeline import QuantizeOptions, quantize_checkpoint

    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        text = Path(args.calibration_text).read_text() if args.calibration_text else None
        options = QuantizeOptions(method=args.method, bits=args.bits, group_size=args.group_size,
                                  desc_act=args.desc_act, sym=args.sym, rtn=args.rtn,
                                  calibration_text=text, num_samples=args.num_samples,
                                  seq_len=args.seq_len, true_sequential=args.true_sequential,
                                  output_clip=args.output_clip,
                                  clip_search=args.clip_search, static_groups=args.static_groups,
                                  act_order_block=args.act_order_block,
                                  prefit_grids=args.prefit_grids,
                                  refine=args.refine, refit=args.refit,
                                  descent=args.descent,
                                  awq_gptq=args.awq_gptq, awq_scales=args.awq_scales,
                                  rotate=args.rotate, format=args.format,
                                  device=args.device,
                                  **({} if args.damp is None else {"damp": args.damp}))
        model = Path(args.model_tag) if args.model_tag else default_model_path()
        if not (model / "config.json").is_file():
            raise ValueError(f"{model} is not a Hugging Face model folder (no config.json)")
        quantize_checkpoint(model, args.output, options)
    except (ValueError, OSError) as exc:
        print(f"tamis quantize: error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {args.output}")
    return 0
