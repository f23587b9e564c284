"""W4A16 GEMMs at Llama-3.1-8B layer shapes against vLLM's own W4A16 kernels on one Hopper
GPU, in one process: bf16 ``F.linear``, tamis's W4A16 kernel as a bf16 model's layer gets
it at load (``tamis.quant.wna16_kernels``), Marlin with integer zero
points (vLLM's AWQ kernel before Hopper and its fallback), Marlin symmetric (GPTQ ``sym:
true``, codes offset by 8, no zero points: Marlin's lightest path) and Machete with zero
points (vLLM 0.26's first choice on Hopper for AWQ, GPTQ and compressed-tensors W4A16: its
log says "Using MacheteLinearKernel for AutoAWQMarlinLinearMethod"). One random 4-bit
group-128 layer per shape, 16 copies of each kernel's operands cycled, CUDA-graph replay
(``bench_quant.graph_time``); every kernel's output checked against the fp32 product of its
own dequantized weight before it is timed.

vLLM is not imported: its kernels are loaded from the library of its wheel
(``vllm/_C_stable_libtorch.abi3.so``, ``torch.ops.load_library``) and its scalar-type ids
from the wheel's ``vllm/scalar_type.py``, so only those two files travel to the GPU.

    python bench/bench_w4a16_peers.py --vllm-lib PATH.so --vllm-scalar-types PATH.py
        [--ms 1 16 64 128 256] [--shapes 4096x4096 ...]
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_quant import (bf16_weight, cycling, graph_time, parse_shapes,  # noqa: E402
                         relative_error, start_on_gpu, w4a16_layer, w4a16_operands,
                         weight_copies)

GROUP = 128
COPIES = 16


def load_vllm(library: str, scalar_types_file: str):
    """vLLM's ops (``torch.ops._C``) and its ``scalar_types`` namespace."""
    torch.ops.load_library(library)
    spec = importlib.util.spec_from_file_location("vllm_scalar_type", scalar_types_file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while building
    spec.loader.exec_module(module)
    return torch.ops._C, module.scalar_types


def marlin_column_order(n: int, device) -> torch.Tensor:
    """Marlin's order of the columns of a group's scales and zero points: within each run of
    64 columns, the 8 x 8 block read column-major (position 8i + j holds column 8j + i)."""
    block = torch.arange(64, device=device).view(8, 8).t().reshape(-1)
    return (torch.arange(0, n, 64, device=device)[:, None] + block[None, :]).reshape(-1)


def marlin_zero_points(zeros: torch.Tensor) -> torch.Tensor:
    """Integer zero points [K/G, N] in Marlin's layout: its column order, then AutoAWQ's
    nibble order inside each word (Marlin's dequantizer reads them that way), 8 a word."""
    from tamis.quant.packing import pack_awq
    return pack_awq(zeros[:, marlin_column_order(zeros.shape[1], zeros.device)])


class Layer:
    """One random 4-bit group-128 layer [K, N]: words packed along K, fp16 scales, integer
    zero points, and the bf16 weight bf16 ``F.linear`` reads (drawn as ``bench_quant``
    draws them)."""

    def __init__(self, k: int, n: int):
        self.k, self.n = k, n
        self.weight = bf16_weight(k, n)
        self.qweight, self.scales, self.zeros = w4a16_operands(k, n, GROUP)

    def dequantized(self, zero_points: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        """The fp32 weight [K, N] of the layer's codes with these zero points and scales."""
        from tamis.kernels.w4a16 import dequantize_wna16
        return dequantize_wna16(self.qweight, scales, zero_points, GROUP, 4, self.k)


def tamis_kernel(layer: Layer):
    """The kernel a bf16 model's layer gets at load, on the words it re-packed them to."""
    loaded = w4a16_layer(layer.qweight, layer.scales, layer.zeros, group=GROUP)
    kernel = loaded.wna16_kernel
    operands = (loaded.wna16_qweight, loaded.wna16_scales, loaded.wna16_zeros)
    reference = layer.dequantized(layer.zeros, layer.scales)

    def run(x, words, scales, zeros):
        return kernel.launchers[kernel.route(x.shape[0])](x, words, scales, zeros, GROUP)
    return reference, operands, run


def marlin_kernel(layer: Layer, ops, scalar_types, symmetric: bool):
    """Marlin on the layer's codes, bf16 scales (Marlin takes x's dtype); symmetric: zero
    point 8 everywhere (GPTQ ``sym: true``), else the layer's zero points."""
    k, n, device = layer.k, layer.n, layer.qweight.device
    words = ops.gptq_marlin_repack(layer.qweight, torch.empty(0, dtype=torch.int32,
                                                              device=device), k, n, 4, False)
    scales = layer.scales.to(torch.bfloat16)
    marlin_scales = scales[:, marlin_column_order(n, device)].contiguous()
    if symmetric:
        kind, zero_points = scalar_types.uint4b8, None
        reference = layer.dequantized(torch.full_like(layer.zeros, 8), scales)
    else:
        kind, zero_points = scalar_types.uint4, marlin_zero_points(layer.zeros.to(torch.int32))
        reference = layer.dequantized(layer.zeros, scales)
    workspace = torch.zeros(torch.cuda.get_device_properties(device).multi_processor_count,
                            dtype=torch.int32, device=device)
    no_act_order = torch.empty(0, dtype=torch.int32, device=device)  # as vLLM passes it

    def run(x, words, scales, zero_points):
        return ops.marlin_gemm(x, None, words, None, scales, None, None, zero_points,
                               no_act_order, no_act_order, workspace, kind.id, x.shape[0], n,
                               k, True, False, True, False)
    return reference, (words, marlin_scales, zero_points), run


def machete_kernel(layer: Layer, ops, scalar_types):
    """Machete with zero points, prepared as vLLM's Machete linear kernel prepares a GPTQ
    asymmetric layer: words prepacked from [K/8, N] column-major, bf16 scales, and the zero
    points as -scale * zero in bf16."""
    kind = scalar_types.uint4
    words = ops.machete_prepack_B(layer.qweight.t().contiguous().t(), torch.bfloat16, kind.id,
                                  torch.bfloat16)
    scales = layer.scales.to(torch.bfloat16)
    zeros = (-scales.float() * layer.zeros.float()).to(torch.bfloat16)
    reference = layer.dequantized(layer.zeros, scales)

    def run(x, words, scales, zeros):
        return ops.machete_mm(x, words, kind.id, None, scales, zeros, GROUP, None, None, None)
    return reference, (words, scales, zeros), run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-lib", required=True, help="vllm/_C_stable_libtorch.abi3.so")
    parser.add_argument("--vllm-scalar-types", required=True, help="vllm/scalar_type.py")
    parser.add_argument("--ms", type=int, nargs="+", default=[1, 16, 64, 128, 256])
    parser.add_argument("--shapes", nargs="+", help="KxN (default: all four)")
    args = parser.parse_args()
    ops, scalar_types = load_vllm(args.vllm_lib, args.vllm_scalar_types)
    start_on_gpu()
    names = ("tamis", "marlin-zp", "marlin-sym", "machete-zp")
    print("KxN            M    bf16 " + " ".join(f"{name:>10s}     x" for name in names)
          + "  (us; x = bf16 / kernel)")
    for k, n in parse_shapes(args.shapes):
        layer = Layer(k, n)
        kernels = [tamis_kernel(layer), marlin_kernel(layer, ops, scalar_types, False),
                   marlin_kernel(layer, ops, scalar_types, True),
                   machete_kernel(layer, ops, scalar_types)]
        kernels = [(reference, weight_copies(operands, COPIES), run)
                   for reference, operands, run in kernels]
        bf16_copies = [w for (w,) in weight_copies((layer.weight,), COPIES)]
        for m in args.ms:
            x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            t_bf16 = graph_time(cycling([lambda w=w: F.linear(x, w) for w in bf16_copies]))
            row = f"{k}x{n:<6} {m:4d} {t_bf16 * 1e3:7.1f}"
            for name, (reference, copies, run) in zip(names, kernels):
                err = relative_error(run(x, *copies[0]), x.float() @ reference)
                assert err < 2e-2, f"{name} at {k}x{n} M={m}: rel err {err:.3g}"
                t = graph_time(cycling([lambda c=c, r=run: r(x, *c) for c in copies]))
                row += f" {t * 1e3:10.1f} {t_bf16 / t:5.2f}"
            print(row, flush=True)
        del kernels, bf16_copies, layer
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
