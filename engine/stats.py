"""A snapshot of the engine's state and counters, for logs and the server's /metrics."""
from __future__ import annotations

from dataclasses import dataclass


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
    structured_output_compiles: int = 0          # grammars compiled (cumulative)
    structured_output_cache_hits: int = 0        # compilations served from the cache
    structured_output_compile_seconds: float = 0.0
    structured_output_mask_seconds: float = 0.0  # time filling token bitmasks

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0


__all__ = ["EngineStats"]
