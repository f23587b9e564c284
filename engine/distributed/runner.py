"""The model runners of a multi-process engine (tensor and pipeline parallelism).

``ShardRunner`` is one rank's ``ModelRunner``: its model is built under the rank's groups
(so every parallel layer holds its slice and runs its collectives, and a pipeline stage
holds its layers only), its KV cache holds the rank's key/value heads of its layers, and
its block count is the smallest any rank can afford, so that the one block table rank
0's scheduler writes is valid on every rank.

``DriverRunner`` is rank 0's: the engine's runner. It starts the other ranks
(``WorkerPool``) and for each step sends them the scheduled chunks before running the
same step itself. Rank 0 alone samples (``ModelRunner.sample``), applying
structured-output masks there, on logits it computed (one stage) or received from the
last stage's first rank::

    stage 0 (rank 0 ...)  --hidden, residual-->  stage 1  -- ... -->  last stage
          ^                                                             |
          +--------------------------- logits [rows, V] ----------------+
"""
from __future__ import annotations

import logging
import time
import weakref

import torch

from tamis.engine.attention.metadata import forward_context
from tamis.engine.config import EngineConfig
from tamis.engine.distributed.parallel_state import (SINGLE_STAGE, PPGroup, TPGroup,
                                                     model_parallel)
from tamis.engine.distributed.workers import StepMessage, WorkerPool
from tamis.engine.runner import InflightTokens, ModelInputs, ModelRunner, RunnerOutput
from tamis.engine.scheduler import SchedulerOutput

logger = logging.getLogger(__name__)

# An idle engine learns that a rank it did not start has ended only from a collective; it
# runs one this often (a rank process of its own host is seen at once, by its sentinel).
REMOTE_RANK_CHECK_S = 5.0


class ShardRunner(ModelRunner):
    """A rank's runner (ranks other than 0 use it as is, through ``run_step``)."""

    def __init__(self, config: EngineConfig, device: torch.device, tp: TPGroup,
                 pp: PPGroup = SINGLE_STAGE) -> None:
        from tamis.engine.loader import kv_cache_spec

        self.tp, self.pp = tp, pp
        with model_parallel(tp, pp):
            super().__init__(config, device)
        num_layers = self.hf_config.num_hidden_layers
        self.kv_spec = kv_cache_spec(self.hf_config, tp.size, pp.layer_range(num_layers),
                                     hybrid=self.hybrid_kv)

    # --- KV cache ---------------------------------------------------------------------------

    def determine_num_blocks(self, max_model_len: int, max_num_seqs: int,
                             max_num_batched_tokens: int) -> int:
        own = super().determine_num_blocks(max_model_len, max_num_seqs, max_num_batched_tokens)
        return self.pp.world.min_over_ranks(own)

    def initialize_kv_cache(self, max_model_len: int, max_num_seqs: int,
                            max_num_batched_tokens: int) -> int:
        """The KV tensors of this rank's layers (None for another stage's layers)."""
        num_blocks = self.determine_num_blocks(max_model_len, max_num_seqs, max_num_batched_tokens)
        self.kv_caches = self.allocate_kv_tensors(num_blocks)
        logger.info("KV cache: %d blocks of %d tokens (%.1f MiB on this rank)", num_blocks,
                    self.block_size, num_blocks * self.block_bytes / 2**20)
        return num_blocks

    # --- one step ---------------------------------------------------------------------------

    @torch.inference_mode()
    def run_step(self, step: StepMessage) -> None:
        """A rank's share of one step (ranks other than 0); logits are sent or dropped."""
        inputs = self.prepare_inputs(step, None)
        if step.has_inflight and self.pp.is_first:
            self.tp.broadcast(inputs.input_ids)   # rank 0's in-flight ids
        self.compute_logits(self.forward(inputs), inputs)

    def forward(self, inputs: ModelInputs) -> torch.Tensor | None:
        """Final hidden states on the last stage; None on the others, which send theirs on."""
        pp = self.pp
        if pp.num_stages == 1:
            return super().forward(inputs)
        with forward_context(inputs.attn_metadata, self.kv_caches, inputs.group_metadata):
            received = None if pp.is_first else self._receive(inputs.input_ids.numel())
            out = self.model(inputs.input_ids, inputs.positions, received)
        if pp.is_last:
            return out
        for tensor in out:
            pp.send(tensor, pp.global_rank(pp.stage + 1))
        return None

    def _receive(self, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        source = self.pp.global_rank(self.pp.stage - 1)
        shape = (num_tokens, self.hf_config.hidden_size)
        return tuple(self.pp.recv(torch.empty(shape, dtype=self.dtype, device=self.device),
                                  source) for _ in range(2))

    def compute_logits(self, hidden: torch.Tensor | None,
                       inputs: ModelInputs) -> RunnerOutput | None:
        """One stage: every rank's logits. Several: the last stage's first rank sends
        them to rank 0, which returns them; the other ranks return None."""
        pp = self.pp
        if pp.num_stages == 1:
            return super().compute_logits(hidden, inputs)
        rows = self.logit_rows(inputs)
        last_stage_head = pp.global_rank(pp.num_stages - 1) - self.tp.rank
        if pp.is_last:
            logits = self.model.compute_logits(hidden[rows]).float()
            if self.tp.rank == 0:
                pp.send(logits, 0)
            return None
        if pp.world.rank != 0:
            return None
        logits = torch.empty(rows.numel(), self.vocab_size, device=self.device)
        return self.split_logits(pp.recv(logits, last_stage_head), inputs)


class DriverRunner(ShardRunner):
    """Rank 0's runner: the engine's, driving the other ranks."""

    def __init__(self, config: EngineConfig, device: torch.device) -> None:
        if config.node_rank != 0:
            raise ValueError(f"--node-rank {config.node_rank} runs other ranks than the "
                             f"engine's: start that host with python -m "
                             f"tamis.engine.distributed.node and the same flags")
        self.workers = WorkerPool.start(config, device)
        self._next_remote_check = 0.0
        self._finalizer = weakref.finalize(self, self.workers.close)
        try:
            with self.workers.watch():
                super().__init__(config, device, self.workers.tp, self.workers.pp)
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

    @property
    def rank_sentinels(self) -> list[int]:
        """Handles that become ready when a rank process of this host ends: an idle
        engine waits on them too (``engine/core/process.py``)."""
        return self.workers.sentinels

    @property
    def rank_check_interval_s(self) -> float | None:
        """How often an idle engine calls ``check_ranks``; None: only when a sentinel fires
        (every rank is a process it started)."""
        return REMOTE_RANK_CHECK_S if self.workers.has_remote_ranks else None

    def check_ranks(self) -> None:
        """RankFailedError naming the rank if one has ended: the rank processes of this
        host are checked at once, other ranks (another host's, torchrun's) by a collective,
        at most every ``REMOTE_RANK_CHECK_S``."""
        self.workers.check_alive()
        if self.workers.has_remote_ranks and time.monotonic() >= self._next_remote_check:
            self.workers.ping()
            self._next_remote_check = time.monotonic() + REMOTE_RANK_CHECK_S

    def shutdown(self) -> None:
        """Stops the other ranks (also done when the runner is collected or at exit)."""
        self._finalizer()
