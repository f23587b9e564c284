"""Fused-MoE layer on the GPU: tamis's Triton kernel against its torch reference and vLLM's
``fused_experts`` (when vLLM imports), on one Mixtral-8x7B layer by default
(E=8, top-2, H=4096, I=14336, random weights) at 1, 64 and 2,048 tokens.

    python bench/bench_moe.py [--tokens 1 64 2048] [--experts 8 --top-k 2
                               --hidden 4096 --intermediate 14336]
                              [--weights bf16 int4 fp8 fp8-block int8]

``--weights`` picks the expert weights (each timed separately, bf16 activations):
``bf16``; ``int4``, AWQ-style 4-bit codes with group-128 fp16 scales and zero points
(tamis: ``WNA16Experts``; vLLM: its ``int4_w4a16`` Triton path, the same codes repacked
into its uint8 layout); ``fp8``, e4m3 weights with per-channel scales (tamis: W8A8 on an
FP8 GPU; vLLM: ``fp8_w8a8`` with per-token activations and per-channel weights);
``fp8-block``, e4m3 weights with a scale per 128x128 block as DeepSeek-V3 and
Qwen3-FP8 ship them (tamis: ``Fp8BlockExperts``, W8A8 with activations scaled per token
and group of 128 on an FP8 GPU; vLLM: ``fp8_w8a8`` with ``block_shape=[128, 128]``, the
same codes and scales); ``int8``, int8 weights with per-channel scales (tamis:
``Int8Experts``, W8A8 with per-token int8 activations; vLLM: ``int8_w8a8`` with
per-token activations).

Routing (softmax, top-k, renormalised) is computed once per batch size and is not timed:
each row times the experts alone, from routed tokens to the summed output, eager
(``triton.testing.do_bench``, median) and replayed from a CUDA graph (what a decode step
runs). Every output is checked against the reference before it is timed. ``floor`` is the
expert weight bytes the batch touches divided by the measured copy bandwidth.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

import torch

from tamis.engine.layers.fused_moe import select_experts
from tamis.kernels.fused_moe import default_tiles, fused_experts_ref, fused_experts_triton
from tamis.kernels.moe_weights import Fp8BlockExperts, Fp8Experts, Int8Experts, WNA16Experts

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_quant import graph_time  # noqa: E402


def bench_ms(fn) -> float:
    from triton.testing import do_bench
    return do_bench(fn, warmup=25, rep=200, return_mode="median")


def graph_ms(fn) -> float | None:
    """Milliseconds per call replayed from a CUDA graph (``bench_quant.graph_time``);
    None if ``fn`` cannot be captured."""
    try:
        return graph_time(fn)
    except RuntimeError:
        return None


def copy_bandwidth() -> float:
    """Device-to-device copy of 2 GiB, bytes read + written per second."""
    src = torch.empty(1024**3, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    return 2 * src.numel() * 2 / (bench_ms(lambda: dst.copy_(src)) * 1e-3)


def vllm_fused_experts():
    """vLLM's fused_experts, or the reason it is not available."""
    try:
        from vllm.model_executor.layers.fused_moe import fused_experts
    except Exception as exc:  # not installed, or built for another torch
        return None, f"{type(exc).__name__}: {exc}"
    return fused_experts, None


# ---------------------------------------------------------------- expert weights

GROUP = 128


def bf16_weights(e: int, n: int, k: int) -> torch.Tensor:
    return (torch.randn(e, n, k, device="cuda") * k ** -0.5).bfloat16()


def int4_weights(e: int, n: int, k: int) -> tuple[WNA16Experts, dict]:
    """Random 4-bit codes, zero points and fp16 scales: tamis's form and vLLM's
    (codes uint8 [E, N, K/2], low nibble first; scales [E, N, K/G]; zero points uint8
    [E, N/2, K/G])."""
    from tamis.quant.packing import pack_int32
    groups = k // GROUP
    codes = torch.randint(0, 16, (e, k, n), dtype=torch.int32, device="cuda")
    zeros = torch.randint(6, 10, (e, groups, n), dtype=torch.int32, device="cuda")
    scales = (torch.rand(e, groups, n, device="cuda") + 0.5).half() * (k ** -0.5 / 8)
    qweight = torch.stack([pack_int32(codes[i], 4, dim=0) for i in range(e)])
    tamis = WNA16Experts(qweight, scales, zeros.half(), GROUP, 4, k)
    by_n = codes.transpose(1, 2)                                        # [E, N, K]
    zeros_by_n = zeros.transpose(1, 2)                                  # [E, N, G]
    vllm = dict(w=(by_n[..., 0::2] | (by_n[..., 1::2] << 4)).to(torch.uint8).contiguous(),
                scale=scales.transpose(1, 2).bfloat16().contiguous(),
                zp=(zeros_by_n[:, 0::2] | (zeros_by_n[:, 1::2] << 4)).to(torch.uint8).contiguous())
    return tamis, vllm


def fp8_weights(e: int, n: int, k: int) -> tuple[Fp8Experts, dict]:
    dense = torch.randn(e, n, k, device="cuda") * k ** -0.5
    scale = dense.abs().amax(dim=2) / 448.0
    codes = (dense / scale[..., None]).to(torch.float8_e4m3fn)
    return Fp8Experts(codes, scale), dict(w=codes, scale=scale[..., None].contiguous())


def fp8_block_weights(e: int, n: int, k: int, shard_rows: int) -> tuple[Fp8BlockExperts, dict]:
    """e4m3 codes with one scale per 128x128 block (n and k whole blocks, so tamis's
    per-shard block rows are vLLM's block rows of the stacked w13)."""
    block = 128
    dense = torch.randn(e, n // block, block, k // block, block, device="cuda") * k ** -0.5
    scale_inv = dense.abs().amax(dim=(2, 4)) / 448.0                     # [E, N/128, K/128]
    codes = (dense / scale_inv[:, :, None, :, None]).to(torch.float8_e4m3fn).reshape(e, n, k)
    return (Fp8BlockExperts(codes, scale_inv, shard_rows, (block, block)),
            dict(w=codes, scale=scale_inv))


def int8_weights(e: int, n: int, k: int) -> tuple[Int8Experts, dict]:
    codes = torch.randint(-128, 128, (e, n, k), dtype=torch.int8, device="cuda")
    scale = (torch.rand(e, n, device="cuda") + 0.5) / (127 * k ** 0.5)
    return Int8Experts(codes, scale), dict(w=codes, scale=scale[..., None].contiguous())


def expert_bytes(w, expert: int = 0) -> int:
    """Bytes of one expert's weight (scales and zero points included)."""
    if isinstance(w, torch.Tensor):
        return w[expert].numel() * w.element_size()
    if isinstance(w, WNA16Experts):
        tensors = (w.qweight, w.scales, w.zeros)
    elif isinstance(w, Fp8BlockExperts):
        tensors = (w.weight, w.scale_inv)
    else:
        tensors = (w.weight, w.scale)
    return sum(t[expert].numel() * t.element_size() for t in tensors)


def vllm_call(fused_experts, kind: str, w13_v, w2_v):
    """A callable (x, weights, ids) for vLLM with the same quantized weights, across
    its two APIs (a ``quant_config`` object, or the older ``use_*`` flags)."""
    if kind == "bf16":
        return lambda x, weights, ids: fused_experts(x, w13_v, w2_v, weights, ids)
    try:
        from vllm.model_executor.layers.fused_moe import config as moe_config
    except ImportError:
        moe_config = None
    if kind == "int4":
        flags = dict(w1_scale=w13_v["scale"], w2_scale=w2_v["scale"], w1_zp=w13_v["zp"],
                     w2_zp=w2_v["zp"], block_shape=[0, GROUP])
        if moe_config is not None and hasattr(moe_config, "int4_w4a16_moe_quant_config"):
            quant = moe_config.int4_w4a16_moe_quant_config(**flags)
            return lambda x, weights, ids: fused_experts(
                x, w13_v["w"], w2_v["w"], weights, ids, quant_config=quant)
        return lambda x, weights, ids: fused_experts(
            x, w13_v["w"], w2_v["w"], weights, ids, use_int4_w4a16=True, **flags)
    scales = dict(w1_scale=w13_v["scale"], w2_scale=w2_v["scale"])
    if kind == "fp8-block":
        flags, builder, old_flag = dict(block_shape=[128, 128]), "fp8_w8a8", "use_fp8_w8a8"
    elif kind == "int8":
        flags, builder, old_flag = dict(per_act_token_quant=True), "int8_w8a8", "use_int8_w8a8"
    else:
        flags, builder, old_flag = dict(per_act_token_quant=True), "fp8_w8a8", "use_fp8_w8a8"
    make_config = getattr(moe_config, f"{builder}_moe_quant_config", None)
    if make_config is not None:
        quant = _vllm_quant_config(make_config, kind, **scales, **flags)
        return lambda x, weights, ids: fused_experts(
            x, w13_v["w"], w2_v["w"], weights, ids, quant_config=quant)
    return lambda x, weights, ids: fused_experts(
        x, w13_v["w"], w2_v["w"], weights, ids, **{old_flag: True}, **scales, **flags)


def _vllm_quant_config(make_config, kind: str, **flags):
    """vLLM's FusedMoEQuantConfig: int8's builder requires the activation scales (None:
    dynamic); per-channel FP8 says per_out_ch_quant where the version has it (older
    ones infer it from the scales)."""
    if kind == "int8":
        return make_config(a1_scale=None, a2_scale=None, **flags)
    if kind == "fp8":
        try:
            return make_config(**flags, per_out_ch_quant=True)
        except TypeError:
            pass
    return make_config(**flags)


def make_weights(kind: str, e: int, h: int, i: int, vllm):
    """(tamis w13, tamis w2, vLLM callable or None) for ``kind``."""
    if kind == "bf16":
        w13, w2 = bf16_weights(e, 2 * i, h), bf16_weights(e, h, i)
        return w13, w2, vllm and vllm_call(vllm, kind, w13, w2)
    if kind == "fp8-block":
        (w13, w13_v), (w2, w2_v) = fp8_block_weights(e, 2 * i, h, i), fp8_block_weights(e, h, i, h)
        return w13, w2, vllm and vllm_call(vllm, kind, w13_v, w2_v)
    make = {"int4": int4_weights, "fp8": fp8_weights, "int8": int8_weights}[kind]
    (w13, w13_v), (w2, w2_v) = make(e, 2 * i, h), make(e, h, i)
    return w13, w2, vllm and vllm_call(vllm, kind, w13_v, w2_v)


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.double(), want.double()
    return float((got - want).norm() / want.norm().clamp_min(1e-30))


def run_case(kind: str, tokens: int, w13, w2, top_k: int, bandwidth: float, vllm) -> list[dict]:
    experts, _, hidden = w13.shape
    x = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16)
    weights, ids = select_experts(torch.randn(tokens, experts, device="cuda"), top_k, True)
    touched = ids.unique().numel()
    floor_ms = touched * (expert_bytes(w13) + expert_bytes(w2)) / bandwidth * 1e3
    want = fused_experts_ref(x, w13, w2, weights, ids)
    candidates = {"reference": lambda: fused_experts_ref(x, w13, w2, weights, ids),
                  "tamis": lambda: fused_experts_triton(x, w13, w2, weights, ids)}
    if vllm is not None:
        candidates["vllm"] = lambda: vllm(x, weights, ids)
    rows = []
    for name, fn in candidates.items():
        rows.append(dict(weights=kind, tokens=tokens, kernel=name,
                         rel_err=round(relative_error(fn(), want), 5), ms=round(bench_ms(fn), 4),
                         graph_ms=None if name == "reference" else _rounded(graph_ms(fn)),
                         floor_ms=round(floor_ms, 4), experts_touched=touched))
        print(json.dumps(rows[-1]), flush=True)
    tiles = default_tiles(tokens, experts, top_k)
    print(json.dumps(dict(tokens=tokens, tamis_tiles=dataclasses.asdict(tiles))), flush=True)
    return rows


def _rounded(ms: float | None) -> float | None:
    return None if ms is None else round(ms, 4)


def print_table(rows: list[dict]) -> None:
    print(f"\n{'weights':>9} {'tokens':>6} {'kernel':>9} {'ms':>8} {'graph ms':>9} "
          f"{'floor ms':>9} {'rel err':>8}  vLLM time / this (graph times where captured)")
    vllm_ms = {(r["weights"], r["tokens"]): r["graph_ms"] or r["ms"]
               for r in rows if r["kernel"] == "vllm"}
    for r in rows:
        mine, key = r["graph_ms"] or r["ms"], (r["weights"], r["tokens"])
        ratio = f"{vllm_ms[key] / mine:.2f}x" if key in vllm_ms else "-"
        graph = "-" if r["graph_ms"] is None else f"{r['graph_ms']:.4f}"
        print(f"{r['weights']:>9} {r['tokens']:>6} {r['kernel']:>9} {r['ms']:>8.4f} {graph:>9} "
              f"{r['floor_ms']:>9.4f} {r['rel_err']:>8.5f}  {ratio}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 64, 2048])
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--intermediate", type=int, default=14336)
    parser.add_argument("--weights", nargs="+", default=["bf16"],
                        choices=["bf16", "int4", "fp8", "fp8-block", "int8"])
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_moe.py needs a CUDA GPU")
    torch.manual_seed(0)
    e, h, i = args.experts, args.hidden, args.intermediate
    vllm, reason = vllm_fused_experts()
    print(json.dumps(dict(device=torch.cuda.get_device_name(), shape=dict(E=e, top_k=args.top_k,
                                                                     H=h, I=i),
                          vllm=reason or "fused_experts imported")), flush=True)
    bandwidth = copy_bandwidth()
    rows = []
    for kind in args.weights:
        w13, w2, vllm_fn = make_weights(kind, e, h, i, vllm)
        rows += [row for tokens in args.tokens
                 for row in run_case(kind, tokens, w13, w2, args.top_k, bandwidth, vllm_fn)]
        del w13, w2, vllm_fn
        torch.cuda.empty_cache()
    print_table(rows)


if __name__ == "__main__":
    main()
