"""The model runners of a tensor-parallel engine.

``ShardRunner`` is one rank's ``ModelRunner``: its model is built under the rank's group
(so every parallel layer holds its slice and runs its collectives), its KV cache holds
the rank's key/value heads, and its block count is the smallest any rank can afford, so
that the one block table rank 0's scheduler writes is valid on every rank.

``TensorParallelRunner`` is rank 0's: the engine's runner. It starts the other ranks
(``WorkerPool``), and for each step sends them the scheduled chunks before running the
same forward pass itself; every rank then holds the gathered logits, and rank 0 alone
samples (``ModelRunner.sample``), applying structured-output masks there.
"""
from __future__ import annotations

import weakref

import torch

from tamis.engine.config import EngineConfig
from tamis.engine.distributed.parallel_state import TPGroup, tensor_parallel
from tamis.engine.distributed.workers import StepMessage, WorkerPool
from tamis.engine.runner import InflightTokens, ModelInputs, ModelRunner, RunnerOutput
from tamis.engine.scheduler import SchedulerOutput


class ShardRunner(ModelRunner):
    """Rank ``group.rank``'s runner (ranks 1..N-1 use it as is, through ``run_step``)."""

    def __init__(self, config: EngineConfig, device: torch.device, group: TPGroup) -> None:
        from tamis.engine.loader import kv_cache_spec

        self.tp = group
        with tensor_parallel(group):
            super().__init__(config, device)
        self.kv_spec = kv_cache_spec(self.hf_config, group.size)

    def determine_num_blocks(self, max_model_len: int, max_num_seqs: int,
                             max_num_batched_tokens: int) -> int:
        own = super().determine_num_blocks(max_model_len, max_num_seqs, max_num_batched_tokens)
        return self.tp.min_over_ranks(own)

    @torch.inference_mode()
    def run_step(self, step: StepMessage) -> None:
        """A non-zero rank's share of one step; the logits it gathers are dropped."""
        inputs = self.prepare_inputs(step, None)
        if step.has_inflight:
            self.tp.broadcast(inputs.input_ids)
        self.compute_logits(self.forward(inputs), inputs)


class TensorParallelRunner(ShardRunner):
    """Rank 0's runner: the engine's, driving ranks 1..N-1."""

    def __init__(self, config: EngineConfig, device: torch.device) -> None:
        self.workers = WorkerPool.start(config, device)
        self._finalizer = weakref.finalize(self, self.workers.close)
        try:
            with self.workers.watch():
                super().__init__(config, device, self.workers.group)
            self.workers.wait_ready()
        except BaseException:
            self.workers.close()
            raise

    def initialize_kv_cache(self, max_model_len: int, max_num_seqs: int,
                            max_num_batched_tokens: int) -> int:
        self.workers.send(("init_kv", max_model_len, max_num_seqs, max_num_batched_tokens))
        with self.workers.watch():
            return super().initialize_kv_cache(max_model_len, max_num_seqs,
                                               max_num_batched_tokens)

    @torch.inference_mode()
    def execute_model(self, batch: SchedulerOutput,
                      inflight: InflightTokens | None = None) -> RunnerOutput:
        self.workers.send(("step", StepMessage.of(batch, inflight is not None)))
        with self.workers.watch():
            return super().execute_model(batch, inflight)

    def prepare_inputs(self, batch, inflight: InflightTokens | None = None) -> ModelInputs:
        inputs = super().prepare_inputs(batch, inflight)
        if inflight is not None:   # ids sampled by a step still running: only here so far
            self.tp.broadcast(inputs.input_ids)
        return inputs

    def shutdown(self) -> None:
        """Stops the other ranks (also done when the runner is collected or at exit)."""
        self._finalizer()
