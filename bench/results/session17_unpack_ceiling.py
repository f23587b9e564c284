"""Session 17's probe of how much of the one-row W4A16 time the unpack costs (kept as it
ran; bench/results/quant.md, "Session 17"). Each variant runs in a process of its own,
with ``w4a16_fragments._UNPACK`` (the per-word inline PTX of the MMA kernel) replaced
before anything compiles:

    plain      the kernel as it is (3 shifts, 4 lop3, 4 bf16x2 FMAs a word)
    no_zero    shifts and lop3 only (the codes offset by 128, no zero point: wrong sums)
    no_unpack  the word's halves moved into the operand as they are (wrong sums)

The loads, MMAs, scales and split-K sums are the same in all three, so the differences
bound what any cheaper unpack could gain at one row.

    VARIANT=plain python3 -P bench/results/session17_unpack_ceiling.py
"""
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench_quant import cycling, graph_time, w4a16_operands, weight_copies  # noqa: E402


def without_zero_points(template: str) -> str:
    """The unpack's inline PTX without its FMAs and their two registers (the run had this
    text written out; this gives the same text)."""
    kept = [line for line in template.splitlines()
            if "fma" not in line and not line.startswith((" mov.b32 one", " mov.b32 nz"))]
    return "\n".join(kept).replace(", one, nz;", ";")


NO_UNPACK = """{
 .reg .b32 v1;
 xor.b32 v1, $8, $9;
 mov.b32 {$0, $1}, $8;
 mov.b32 {$2, $3}, v1;
 mov.b32 {$4, $5}, $8;
 mov.b32 {$6, $7}, v1;
}"""

if __name__ == "__main__":
    variant = os.environ.get("VARIANT", "plain")
    from tamis.kernels import w4a16_fragments
    if variant != "plain":
        w4a16_fragments._UNPACK = w4a16_fragments.gl.constexpr(
            {"no_zero": without_zero_points(w4a16_fragments._UNPACK_TEMPLATE),
             "no_unpack": NO_UNPACK}[variant])
    from tamis.kernels import w4a16
    from tamis.kernels.w4a16_mma import mma_pack, w4a16_gemm_mma
    torch.manual_seed(0)
    for k, n in [(4096, 6144), (4096, 4096), (4096, 28672), (14336, 4096)]:
        weight = (torch.randn(n, k, device="cuda") * 0.02).to(torch.bfloat16)
        qw, s, z = w4a16_operands(k, n)
        packed = mma_pack(qw, k)
        copies = weight_copies((weight, packed, s, z), 16)
        x = torch.randn(1, k, device="cuda").to(torch.bfloat16)
        ref = x.float() @ w4a16.dequantize_wna16(qw, s, z, 128, 4, k)
        out = w4a16_gemm_mma(x, packed, s, z, 128)
        err = ((out.float() - ref).abs().max() / ref.abs().max()).item()
        tb = graph_time(cycling([lambda c=c: F.linear(x, c[0]) for c in copies]))
        tw = graph_time(cycling([lambda c=c: w4a16_gemm_mma(x, c[1], c[2], c[3], 128)
                                 for c in copies]))
        print(f"{variant:9s} {k}x{n} M=1 bf16 {tb * 1e3:.1f} W4A16 {tw * 1e3:.2f} us "
              f"({tb / tw:.2f}x) err {err:.3g}", flush=True)
