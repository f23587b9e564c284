"""Where a GPU pass spends its time: the CUDA kernels torch's profiler saw, summed by name
and by family, against the pass's wall time.

Used by bench_offline.py ``--kernel-profile`` for tamis and for vLLM (run in-process for
this, ``VLLM_ENABLE_V1_MULTIPROCESSING=0``, so its kernels are in the same trace). The busy
share (kernel time / wall time) says whether an engine waits on the host between kernels;
the families say which kernels a gap between two engines comes from.
"""
from __future__ import annotations

import re
import time
from contextlib import contextmanager

# Family of a kernel, by the first pattern its name matches (lower case).
FAMILIES = (
    # attention first: FlashAttention-3's kernels are cutlass device kernels too
    ("attention", r"attn|attention|flash|fmha|paged|_decode_split|_decode_merge|_prefill_kernel"),
    ("gemm", r"gemm|cutlass|sm90_xmma|cublas|nvjet|matmul|gemv|w4a16|fp8_mm|scaled_mm"),
    ("norm", r"norm"),
    ("rotary", r"rotary|rope"),
    ("activation", r"silu|gelu|act_and_mul|swiglu"),
    ("kv store", r"reshape_and_cache|kv_store|store_kv|cache_kernel"),
    ("sampling", r"sample|argmax|topk|top_k|softmax|sort|gumbel|exponential|bitmask"),
    ("copy", r"memcpy|memset|copy|fill|cat|index|gather|scatter|elementwise|vectorized"),
)


def family(name: str) -> str:
    low = name.lower()
    for label, pattern in FAMILIES:
        if re.search(pattern, low):
            return label
    return "other"


@contextmanager
def kernel_profile(summary: dict, top: int = 15):
    """Profile the block's CUDA kernels; fill ``summary`` with wall seconds, kernel
    milliseconds in all, per family and for the ``top`` kernels by time."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        yield
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    rows = [(e.key, e.count, _device_us(e)) for e in prof.key_averages()]
    rows = [r for r in rows if r[2] > 0]
    busy_ms = sum(us for _, _, us in rows) / 1e3
    families: dict[str, float] = {}
    for name, _, us in rows:
        families[family(name)] = families.get(family(name), 0.0) + us / 1e3
    rows.sort(key=lambda r: -r[2])
    summary.update(
        wall_s=round(wall, 3), kernel_ms=round(busy_ms, 1),
        busy_share=round(busy_ms / 1e3 / wall, 3),
        families_ms={k: round(v, 1) for k, v in sorted(families.items(), key=lambda kv: -kv[1])},
        top=[dict(kernel=name[:90], calls=n, ms=round(us / 1e3, 1)) for name, n, us in rows[:top]])


def _device_us(event) -> float:
    for attr in ("self_device_time_total", "self_cuda_time_total", "device_time_total"):
        value = getattr(event, attr, None)
        if value:
            return float(value)
    return 0.0


def format_profile(label: str, summary: dict) -> str:
    lines = [f"kernel profile {label}: wall {summary['wall_s']} s, kernels "
             f"{summary['kernel_ms']:,.0f} ms (busy {summary['busy_share']:.0%})",
             "  families (ms): " + ", ".join(f"{k} {v:,.0f}"
                                            for k, v in summary["families_ms"].items())]
    lines += [f"  {t['ms']:9,.1f} ms {t['calls']:7d}x {t['kernel']}" for t in summary["top"]]
    return "\n".join(lines)
