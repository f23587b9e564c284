"""A/B of the one-row W4A16 kernel (``tamis.kernels.w4a16_mma``): the default tile
against the same tile with one ``MmaConfig`` field changed, at the Llama-3.1-8B layer
shapes, alternating A and B for a few rounds in one process (the call-to-call spread of
the H200 is larger than the differences looked for), bf16 ``F.linear`` in each round;
16 weight copies cycled, CUDA-graph replay (``bench_quant.py``'s method). Each output is
checked against the fp32 product first.

    python bench/ab_w4a16_one_row.py --field zeros_by_x_sums [--rounds 3]
    python bench/ab_w4a16_one_row.py --field split_k=4 split_k=16   (B, C, ...)
    python bench/ab_w4a16_one_row.py --field last_split_reduces=1+polled_partials=1
    python bench/ab_w4a16_one_row.py --field steps_up_front=0+max_registers=0 \
        words_before_wait
    python bench/ab_w4a16_one_row.py --field ptxas:--register-usage-level=0 \
        ptxas:--register-usage-level=6
    python bench/ab_w4a16_one_row.py --field ... --shapes 4096x4096 4096x6144

``--field NAME`` flips a boolean field; ``NAME=VALUE`` sets an integer one (one variant
each, timed after A in every round; ``A+B`` changes both in one variant); ``ptxas:OPTIONS``
is the default tile built with those ptxas options (e.g. ``ptxas:--register-usage-level=0``:
ptxas places the loop's loads by it, session 19). ``pad=P`` (alone or joined by + to
fields) times the variant on packed words whose rows are P words longer than N (a
strided view: the row stride no longer a power of two); ``spad=P`` the same for the
scales and zero points (rows P values longer). ``--pdl MODE`` launches every GEMM in
that ``tamis.kernels.pdl`` mode (default auto).
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_quant import (bf16_weight, cycling, graph_time, parse_shapes,  # noqa: E402
                         start_on_gpu, w4a16_operands, weight_copies)
from tile_sweep import relative_error  # noqa: E402


def main() -> None:
    from tamis.kernels import w4a16
    from tamis.kernels.w4a16_mma import mma_pack, pick_mma_config
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--field", required=True, nargs="+",
                        help="NAME (a boolean MmaConfig field to flip) or NAME=VALUE (an int)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--shapes", nargs="+", help="KxN (default: all four)")
    parser.add_argument("--pdl", default="auto", help="kernels.pdl mode of every launch")
    args = parser.parse_args()
    from tamis.kernels import pdl
    pdl.set_mode(args.pdl)
    start_on_gpu()
    for k, n in parse_shapes(args.shapes):
        weight = bf16_weight(k, n)
        qweight, scales, zeros = w4a16_operands(k, n)
        packed = mma_pack(qweight, k)
        copies = weight_copies((weight, packed, scales, zeros), 16)
        x = torch.randn(1, k, device="cuda").to(torch.bfloat16)
        ref = x.float() @ w4a16.dequantize_wna16(qweight, scales, zeros, 128, 4, k)
        default = pick_mma_config(1, n, k, 128)
        configs = [(default, "", (0, 0))] + [_variant(default, field) for field in args.field]
        padded = {c[2]: [(c_w, _padded(c_p, c[2][0]), _padded(c_s, c[2][1]),
                          _padded(c_z, c[2][1])) for c_w, c_p, c_s, c_z in copies]
                  for c in configs}
        errors = [_error(x, *padded[c[2]][0][1:], c, ref) for c in configs]
        print(f"{k}x{n} A = default, then {' '.join(args.field)}; err "
              + " | ".join(e if isinstance(e, str) else f"{e:.3g}" for e in errors), flush=True)
        runs = [i for i, e in enumerate(errors) if not isinstance(e, str)]
        for _ in range(args.rounds):
            t_bf16 = graph_time(cycling([lambda c=c: F.linear(x, c[0]) for c in copies]))
            times = {i: _time(x, padded[configs[i][2]], configs[i]) for i in runs}
            print(f"{k}x{n} bf16 {t_bf16 * 1e3:.2f} " + " ".join(
                f"{'ABCDEFGH'[i]} {t * 1e3:.2f} ({t_bf16 / t:.2f}x)" for i, t in times.items())
                + " us", flush=True)


def _time(x, copies, variant) -> float:
    """ms of the variant's GEMM, the weight copies cycled."""
    return graph_time(cycling([lambda c=c: _gemm(x, c[1], c[2], c[3], variant)
                               for c in copies]))


def _error(x, packed, scales, zeros, variant, ref):
    """The variant's relative error against ref, or why it refused this layer (a
    config the kernel does not take here is left out of the timing, not fatal)."""
    try:
        return relative_error(_gemm(x, packed, scales, zeros, variant), ref)
    except ValueError as exc:
        return f"refused ({exc})"


def _variant(config, fields: str) -> tuple:
    """(config, ptxas options, (row pad of the words, of the scales and zero points)):
    ``ptxas:OPTIONS`` keeps the config; otherwise each ``NAME`` flipped or ``NAME=VALUE``
    set (several joined by +; ``pad=P`` and ``spad=P`` the pads), no options."""
    if fields.startswith("ptxas:"):
        return config, fields.removeprefix("ptxas:"), (0, 0)
    pad = spad = 0
    for field in fields.split("+"):
        name, _, value = field.partition("=")
        if name in ("pad", "spad"):
            pad, spad = (int(value), spad) if name == "pad" else (pad, int(value))
            continue
        config = replace(config, **{name: int(value) if value else not getattr(config, name)})
    return config, "", (pad, spad)


def _padded(t: torch.Tensor, pad: int) -> torch.Tensor:
    """t [rows, cols] as a view into rows ``pad`` values longer (the same values)."""
    if not pad:
        return t
    rows, cols = t.shape
    wide = torch.zeros(rows, cols + pad, dtype=t.dtype, device=t.device)
    wide[:, :cols] = t
    return wide[:, :cols]


def _gemm(x, packed, scales, zeros, variant):
    """w4a16_gemm_mma with variant's config, built with its ptxas options (if any) through
    the kernel's compile options; kernels built with other options are cached apart."""
    from tamis.kernels import w4a16_mma
    config, ptxas, _ = variant
    if not ptxas:
        return w4a16_mma.w4a16_gemm_mma(x, packed, scales, zeros, 128, config)
    built = w4a16_mma.mma_compile_options
    w4a16_mma.mma_compile_options = lambda *a: {**built(*a), "ptx_options": ptxas}
    try:
        return w4a16_mma.w4a16_gemm_mma(x, packed, scales, zeros, 128, config)
    finally:
        w4a16_mma.mma_compile_options = built


if __name__ == "__main__":
    main()
