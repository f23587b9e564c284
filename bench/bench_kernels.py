"""Kernel micro-benchmarks on the GPU: each Triton kernel checked, then timed against torch.

Run on a CUDA GPU:  python bench/bench_kernels.py [--out DIR]

- decode attention, 64 sequences x 2,048 tokens, Llama-3.1-8B heads (32 q / 8 kv, D 128),
  bf16, block 16: against the KV-read byte floor (bytes / measured copy bandwidth) and
  torch SDPA over the same K/V laid out densely (no paging); a sweep of split counts and
  tile sizes picks the best launch.
- prefill attention, 8 x 1,024-token prompts: against SDPA (flash, causal) on dense tensors.
- fused add + RMSNorm, rotary, SiLU-and-mul at 8,192 tokens: against the torch code.

Every figure is a median of CUDA-event timings after warm-up, on random data, with a
fresh cache set per timed call where the data would fit in L2. Prints a table last.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "kernels"))

from tamis.kernels.activation import silu_and_mul_ref, silu_and_mul_triton  # noqa: E402
from tamis.kernels.attention_decode import (paged_attention_decode_ref,  # noqa: E402
                                            paged_attention_decode_triton)
from tamis.kernels.attention_prefill import (paged_attention_prefill_ref,  # noqa: E402
                                             paged_attention_prefill_triton)
from tamis.kernels.norm import fused_add_rms_norm_ref, fused_add_rms_norm_triton  # noqa: E402
from tamis.kernels.rotary import rotary_embedding_ref, rotary_embedding_triton  # noqa: E402

ROWS: list[dict] = []


def bench(fn, warmup_ms=25, rep_ms=200) -> float:
    """Median milliseconds of ``fn`` (CUDA events), via triton.testing.do_bench."""
    from triton.testing import do_bench
    return do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median")


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.double(), want.double()
    if not torch.isfinite(got).all():
        return float("nan")
    return float((got - want).norm() / want.norm().clamp_min(1e-30))


def record(group, name, ms, **extra):
    row = dict(group=group, name=name, ms=round(ms, 4), **extra)
    ROWS.append(row)
    print(json.dumps(row), flush=True)


def copy_bandwidth() -> float:
    """Device-to-device copy, bytes read + written per second (the memory ceiling)."""
    src = torch.randn(2 * 1024**3 // 2, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    ms = bench(lambda: dst.copy_(src))
    bw = 2 * src.numel() * 2 / (ms * 1e-3)
    record("ceiling", "d2d copy 2 GiB", ms, TBps=round(bw / 1e12, 3))
    del src, dst
    return bw


def paged_decode_case(num_seqs, seq_len, heads=32, kv_heads=8, dim=128, block_size=16,
                      dtype=torch.bfloat16):
    blocks_per_seq = seq_len // block_size
    num_blocks = num_seqs * blocks_per_seq + 1
    cache = torch.randn(2, num_blocks, block_size, kv_heads, dim, dtype=dtype, device="cuda")
    tables = (torch.randperm(num_blocks - 1, device="cuda")[:num_seqs * blocks_per_seq] + 1)
    tables = tables.view(num_seqs, blocks_per_seq).int()
    q = torch.randn(num_seqs, heads, dim, dtype=dtype, device="cuda")
    seq_lens = torch.full((num_seqs,), seq_len, dtype=torch.int32, device="cuda")
    return q, cache, seq_lens, tables


def bench_decode(bandwidth: float, num_seqs=64, seq_len=2048) -> dict:
    q, cache, seq_lens, tables = paged_decode_case(num_seqs, seq_len)
    scale = 128 ** -0.5
    kv_bytes = num_seqs * seq_len * 8 * 128 * 2 * 2
    floor_ms = kv_bytes / bandwidth * 1e3
    ref = paged_attention_decode_ref(q, cache, seq_lens, tables, scale)
    results = {}
    variants = [dict()]
    for splits in (1, 2, 4):
        for block_n in (64, 128):
            for warps in (4, 8):
                variants.append(dict(num_splits=splits, block_n=block_n, num_warps=warps))
    variants += [dict(num_splits=s, block_n=64, num_warps=4, num_stages=3) for s in (1, 2, 4)]
    variants += [dict(num_splits=s, block_n=128, num_warps=8, num_stages=3) for s in (1, 2)]
    for kw in variants:
        out = torch.full_like(q, float("nan"))
        try:
            paged_attention_decode_triton(q, cache, seq_lens, tables, scale, out=out, **kw)
            err = rel_err(out, ref)
            ms = bench(lambda: paged_attention_decode_triton(q, cache, seq_lens, tables, scale,
                                                             out=out, **kw))
        except Exception as exc:  # a tile that does not compile is skipped, not fatal
            print(f"decode variant {kw} failed: {exc}", flush=True)
            continue
        name = "default" if not kw else ",".join(f"{k}={v}" for k, v in kw.items())
        record("decode", name, ms, rel_err=err, floor_ms=round(floor_ms, 4),
               of_floor=round(floor_ms / ms, 3), KV_TBps=round(kv_bytes / ms / 1e9, 3))
        results[name] = (ms, err)
    # Dense baseline: SDPA over contiguous [B, H, L, D] K/V (what paging costs is the gap).
    k = cache[0, tables.long()].reshape(num_seqs, seq_len, 8, 128).transpose(1, 2).contiguous()
    v = cache[1, tables.long()].reshape(num_seqs, seq_len, 8, 128).transpose(1, 2).contiguous()
    qd = q[:, :, None, :]
    sdpa = lambda: F.scaled_dot_product_attention(qd, k, v, scale=scale, enable_gqa=True)  # noqa
    err = rel_err(sdpa()[:, :, 0], ref)
    record("decode", "torch SDPA dense (enable_gqa)", bench(sdpa), rel_err=err,
           floor_ms=round(floor_ms, 4))
    kr, vr = k.repeat_interleave(4, 1), v.repeat_interleave(4, 1)
    sdpa_rep = lambda: F.scaled_dot_product_attention(qd, kr, vr, scale=scale)  # noqa: E731
    record("decode", "torch SDPA dense (kv repeated)", bench(sdpa_rep),
           rel_err=rel_err(sdpa_rep()[:, :, 0], ref), floor_ms=round(floor_ms, 4))
    return results


def bench_prefill(num_seqs=8, prompt=1024) -> None:
    heads, kv_heads, dim, block_size = 32, 8, 128, 16
    blocks = num_seqs * prompt // block_size
    cache = torch.randn(2, blocks + 1, block_size, kv_heads, dim, dtype=torch.bfloat16,
                        device="cuda")
    tables = (torch.randperm(blocks, device="cuda") + 1).view(num_seqs, -1).int()
    qsl = torch.arange(0, (num_seqs + 1) * prompt, prompt, dtype=torch.int32, device="cuda")
    seq_lens = torch.full((num_seqs,), prompt, dtype=torch.int32, device="cuda")
    q = torch.randn(num_seqs * prompt, heads, dim, dtype=torch.bfloat16, device="cuda")
    scale = dim ** -0.5
    run = lambda: paged_attention_prefill_triton(q, cache, qsl, seq_lens, tables, scale,  # noqa
                                                 max_query_len=prompt)
    err = rel_err(run(), paged_attention_prefill_ref(q, cache, qsl, seq_lens, tables, scale))
    flops = 4 * num_seqs * heads * dim * prompt * prompt / 2    # causal half
    ms = bench(run)
    record("prefill", f"triton paged {num_seqs}x{prompt}", ms, rel_err=err,
           TFLOPs=round(flops / ms / 1e9, 1))
    k = cache[0, tables.long()].reshape(num_seqs, prompt, kv_heads, dim).transpose(1, 2)
    v = cache[1, tables.long()].reshape(num_seqs, prompt, kv_heads, dim).transpose(1, 2)
    k, v = k.repeat_interleave(4, 1).contiguous(), v.repeat_interleave(4, 1).contiguous()
    qd = q.view(num_seqs, prompt, heads, dim).transpose(1, 2).contiguous()
    sdpa = lambda: F.scaled_dot_product_attention(qd, k, v, is_causal=True, scale=scale)  # noqa
    ms = bench(sdpa)
    record("prefill", f"torch SDPA dense causal {num_seqs}x{prompt}", ms,
           TFLOPs=round(flops / ms / 1e9, 1))


def bench_elementwise(tokens=8192, hidden=4096, inter=14336) -> None:
    dt = torch.bfloat16
    x, res = torch.randn(tokens, hidden, dtype=dt, device="cuda"), torch.randn(
        tokens, hidden, dtype=dt, device="cuda")
    w = torch.randn(hidden, dtype=dt, device="cuda")
    out_t, sum_t = fused_add_rms_norm_triton(x, res, w, 1e-5)
    out_r, sum_r = fused_add_rms_norm_ref(x, res, w, 1e-5)
    moved = 4 * tokens * hidden * 2
    for name, fn in (("triton", lambda: fused_add_rms_norm_triton(x, res, w, 1e-5)),
                     ("torch", lambda: fused_add_rms_norm_ref(x, res, w, 1e-5))):
        ms = bench(fn)
        record("fused_add_rms_norm", name, ms, TBps=round(moved / ms / 1e9, 3),
               rel_err=rel_err(out_t, out_r) if name == "triton" else 0.0)
    assert torch.equal(sum_t, sum_r)
    gu = torch.randn(tokens, 2 * inter, dtype=dt, device="cuda")
    err = rel_err(silu_and_mul_triton(gu), silu_and_mul_ref(gu))
    moved = 3 * tokens * inter * 2
    for name, fn in (("triton", lambda: silu_and_mul_triton(gu)),
                     ("torch", lambda: silu_and_mul_ref(gu)),
                     ("torch bf16 (F.silu(g) * u)",
                      lambda: F.silu(gu[:, :inter]) * gu[:, inter:])):
        ms = bench(fn)
        record("silu_and_mul", name, ms, TBps=round(moved / ms / 1e9, 3), rel_err=err)
    positions = torch.randint(0, 8192, (tokens,), device="cuda")
    qkv = torch.randn(tokens, 6144, dtype=dt, device="cuda")
    inv_freq = 1.0 / 500000.0 ** (torch.arange(0, 128, 2, device="cuda").float() / 128)
    q, k = qkv[:, :4096].view(-1, 32, 128), qkv[:, 4096:5120].view(-1, 8, 128)
    ref = qkv.clone()
    rotary_embedding_ref(positions, ref[:, :4096].view(-1, 32, 128),
                         ref[:, 4096:5120].view(-1, 8, 128), inv_freq)
    check = qkv.clone()
    rotary_embedding_triton(positions, check[:, :4096].view(-1, 32, 128),
                            check[:, 4096:5120].view(-1, 8, 128), inv_freq)
    err = rel_err(check, ref)
    moved = 2 * tokens * 5120 * 2

    from tamis.engine.layers.rotary import RotaryEmbedding
    rope = RotaryEmbedding(128, 128, inv_freq)   # the engine layer's torch path
    for name, fn in (("triton (in place)", lambda: rotary_embedding_triton(positions, q, k,
                                                                          inv_freq)),
                     ("torch (engine layer)", lambda: rope(positions, q, k))):
        ms = bench(fn)
        record("rotary", name, ms, TBps=round(moved / ms / 1e9, 3), rel_err=err)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args()
    torch.manual_seed(int(time.time()))
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    bandwidth = copy_bandwidth()
    bench_decode(bandwidth)
    bench_prefill()
    bench_elementwise()
    with open(os.path.join(args.out, "bench_kernels.json"), "w") as f:
        json.dump(ROWS, f, indent=1)
    print("\n| group | variant | ms | figures |\n|---|---|---|---|")
    for row in ROWS:
        extra = {k: v for k, v in row.items() if k not in ("group", "name", "ms")}
        print(f"| {row['group']} | {row['name']} | {row['ms']} | "
              + ", ".join(f"{k} {v}" for k, v in extra.items()) + " |")


if __name__ == "__main__":
    main()
