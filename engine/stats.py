"""A snapshot of the engine's state and counters, for logs and the server's /metrics."""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field

# vLLM's buckets for the number of tokens one engine step computes (iteration_tokens_total).
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


@dataclass
class CumulativeHistogram:
    """Observations counted into fixed upper bounds, Prometheus style: ``counts[i]`` holds the
    values ``<= bounds[i]`` not held by an earlier bucket; ``counts[-1]`` those above every
    bound. Cumulative over the engine's life, so a copy is a consistent scrape."""
    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0

    def __post_init__(self):
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def copy(self) -> CumulativeHistogram:
        return CumulativeHistogram(self.bounds, list(self.counts), self.total)


@dataclass
class EngineStats:
    num_running: int                 # requests (sequences) with KV blocks this step
    num_waiting: int                 # queued, preempted or compiling their grammar
    kv_cache_usage: float            # share of KV blocks in use, 0.0 .. 1.0
    num_free_blocks: int
    num_total_blocks: int
    prefix_cache_queries: int        # tokens looked up in the prefix cache (cumulative)
    prefix_cache_hits: int           # of which found (cumulative)
    num_preemptions: int             # cumulative
    num_prompt_tokens: int = 0       # prompt tokens computed (cumulative, recomputes included)
    num_generation_tokens: int = 0   # tokens sampled (cumulative)
    num_finished_requests: int = 0   # cumulative
    num_waiting_for_grammar: int = 0  # of num_waiting: held until their grammar compiles
    iteration_tokens: CumulativeHistogram | None = None  # tokens computed per step
    structured_output_compiles: int = 0          # grammars compiled (cumulative)
    structured_output_cache_hits: int = 0        # compilations served from the cache
    structured_output_compile_seconds: float = 0.0
    structured_output_mask_seconds: float = 0.0  # time filling token bitmasks

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0


__all__ = ["EngineStats", "CumulativeHistogram", "ITERATION_TOKEN_BUCKETS"]
