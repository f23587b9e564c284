"""The GPU model runner: static step buffers, pinned async copies, CUDA graphs for decode.

What it adds to ``ModelRunner`` (``engine/runner.py``), which already sizes the KV cache
from ``gpu_memory_utilization`` after a profiling pass and samples on the device:

- **Step buffers.** The batch layout (token ids, positions, slots, query starts, sequence
  lengths, block tables, sampled rows) is built on the host into pinned tensors and
  copied with ``non_blocking=True`` into device tensors allocated once; the step's
  ``AttentionMetadata`` views those. Nothing waits for the device until the engine
  reads the sampled ids (copied to pinned memory right after sampling), so the engine
  queues the next step first; a token still in flight is written into the next step's
  input ids on the device (``HostBatch.inflight_rows``).
- **CUDA graphs for decode.** A decode-only step (one new token per request, all
  sampling, no prompt logprobs) of B requests is padded to the smallest captured size
  G >= B and replays the graph captured for G. Padding rows have token 0, position 0,
  slot -1 (nothing stored) and sequence length 0 (the decode kernel writes zeros)::

      captured sizes   1 2 4 8 16 24 32 ... max_num_seqs
      B = 13  ->  G = 16: rows 0..12 real, rows 13..15 padding

  Graphs need the Triton attention backend (the torch backend reads lengths on the
  host); ``enforce_eager`` or another backend runs every step eagerly.

- **KV-cache groups.** A hybrid model (``engine/kv_groups.py``) has a block table per
  group: group 0's goes in ``block_tables`` / ``slot_mapping`` as for any model, groups
  1.. get their own kept rows (``BlockTableRows(..., group)``), step buffers and
  ``AttentionMetadata`` (sharing the rest of the layout); graphs read them from those
  fixed buffers too.

- **Fused elementwise kernels.** ``use_fused_kernels(model)`` routes the model's
  RMSNorm (with its residual add), rotary and SiLU-and-mul modules through
  ``tamis.kernels``: one kernel each instead of five to ten torch ops (at 8,192 tokens
  on the H200: add+RMSNorm 0.07 ms against 0.49, rotary 0.06 against 0.53, SiLU-and-mul
  0.18 against 1.57; bench_kernels.py). The layers take the same path on CUDA tensors
  themselves; the switch points each instance's ``forward`` at its ``forward_fused``
  whatever the device (CPU tests check the kernels subpackage's dispatchers that way).

The pure parts (``capture_sizes``, ``padded_size``, ``is_graph_step``, and
``build_host_batch`` / ``BlockTableRows`` in ``host_batch.py``) take plain Python values
and are tested on CPU; so is the whole runner, eagerly, with the Triton backend interpreted.
"""
from __future__ import annotations

import bisect
import dataclasses
import logging
import time
from dataclasses import dataclass

import numpy as np
import torch

from tamis.engine.attention.kv_scales import scales_pending
from tamis.engine.attention.metadata import AttentionMetadata, forward_context
from tamis.engine.config import EngineConfig
from tamis.engine.host_batch import BlockTableRows, HostBatch, build_host_batch
from tamis.engine.runner import InflightTokens, ModelInputs, ModelRunner
from tamis.engine.scheduler import SchedulerOutput

logger = logging.getLogger(__name__)

MAX_CAPTURE_SIZE = 512


# --- pure parts ------------------------------------------------------------------------------

def capture_sizes(max_num_seqs: int, limit: int = MAX_CAPTURE_SIZE) -> list[int]:
    """Batch sizes to capture: 1, 2, 4, then every multiple of 8, up to max_num_seqs
    (itself included), at most ``limit``. A step of B sequences pads to the next one."""
    if max_num_seqs < 1:
        raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
    top = min(max_num_seqs, limit)
    sizes = {s for s in (1, 2, 4) if s <= top} | set(range(8, top + 1, 8)) | {top}
    return sorted(sizes)


def padded_size(num_seqs: int, sizes: list[int]) -> int | None:
    """The smallest captured size >= num_seqs, or None when it exceeds them all."""
    i = bisect.bisect_left(sizes, num_seqs)
    return sizes[i] if i < len(sizes) else None


def is_graph_step(batch: SchedulerOutput) -> bool:
    """True for a pure decode step: one new token per request, each sampling, no prompt logprobs."""
    return bool(batch.scheduled) and all(
        item.num_new_tokens == 1 and item.samples and not item.num_prompt_logprob_rows
        for item in batch.scheduled)


# --- fused elementwise layers ----------------------------------------------------------------

def use_fused_kernels(model: torch.nn.Module) -> int:
    """Points the model's RMSNorm / RotaryEmbedding / SiluAndMul modules at the fused
    kernels (module docstring); returns how many modules were switched."""
    import types

    from tamis.engine.layers.activation import SiluAndMul
    from tamis.engine.layers.layernorm import RMSNorm
    from tamis.engine.layers.rotary import RotaryEmbedding
    fused = {RMSNorm: RMSNorm.forward_fused, RotaryEmbedding: RotaryEmbedding.forward_fused,
             SiluAndMul: SiluAndMul.forward_fused}
    count = 0
    for module in model.modules():
        forward = fused.get(type(module))
        if forward is not None:
            module.forward = types.MethodType(forward, module)
            count += 1
    return count


# --- device side ------------------------------------------------------------------------------

class StepBuffers:
    """Device tensors allocated once (CUDA graphs read fixed addresses) and pinned host
    mirrors for asynchronous copies."""

    _SPECS = {"input_ids": torch.int64, "positions": torch.int64, "slot_mapping": torch.int64,
              "query_start_loc": torch.int32, "seq_lens": torch.int32,
              "logits_indices": torch.int64, "inflight_rows": torch.int64,
              "inflight_src": torch.int64}

    def __init__(self, max_tokens: int, max_seqs: int, max_blocks_per_seq: int,
                 device: torch.device, num_kv_groups: int = 1):
        sizes = {"input_ids": max_tokens, "positions": max_tokens, "slot_mapping": max_tokens,
                 "query_start_loc": max_seqs + 1, "seq_lens": max_seqs,
                 "logits_indices": max_tokens, "inflight_rows": max_seqs, "inflight_src": max_seqs}
        pin = device.type == "cuda"   # CPU (tests): plain host memory, synchronous copies
        self.device = {name: torch.zeros(sizes[name], dtype=dtype, device=device)
                       for name, dtype in self._SPECS.items()}
        self.host = {name: torch.zeros(sizes[name], dtype=dtype, pin_memory=pin)
                     for name, dtype in self._SPECS.items()}
        self.device["block_tables"] = torch.zeros(max_seqs, max_blocks_per_seq,
                                                  dtype=torch.int32, device=device)
        self.host["block_tables"] = torch.zeros(max_seqs, max_blocks_per_seq,
                                                dtype=torch.int32, pin_memory=pin)
        # KV-cache groups 1.. of a hybrid model: their own block tables and slots.
        self.group_device = [
            {"block_tables": torch.zeros(max_seqs, max_blocks_per_seq, dtype=torch.int32, device=device),
             "slot_mapping": torch.zeros(max_tokens, dtype=torch.int64, device=device)}
            for _ in range(num_kv_groups - 1)]
        self.group_host = [
            {"block_tables": torch.zeros(max_seqs, max_blocks_per_seq, dtype=torch.int32, pin_memory=pin),
             "slot_mapping": torch.zeros(max_tokens, dtype=torch.int64, pin_memory=pin)}
            for _ in range(num_kv_groups - 1)]
        self.on_cuda = pin
        self.max_tokens, self.max_seqs, self.max_blocks = max_tokens, max_seqs, max_blocks_per_seq
        self._copied = None   # event: the last copies out of the pinned buffers are done

    def upload(self, hb: HostBatch) -> dict[str, torch.Tensor]:
        """Copies ``hb`` into the device buffers (async); returns device views of this step
        (with a hybrid model's groups 1.. under "group_block_tables" / "group_slot_mapping")."""
        if len(hb.input_ids) > self.max_tokens or len(hb.seq_lens) > self.max_seqs:
            raise ValueError(f"step of {len(hb.input_ids)} tokens / {len(hb.seq_lens)} "
                             f"sequences exceeds the buffers ({self.max_tokens} / {self.max_seqs})")
        if hb.block_tables.shape[1] > self.max_blocks:
            raise ValueError(f"a block table of {hb.block_tables.shape[1]} blocks exceeds "
                             f"max_model_len's {self.max_blocks}")
        if self._copied is not None:
            self._copied.synchronize()   # the pinned memory is about to be rewritten
        views = {name: self._upload_vector(self.host, self.device, name, getattr(hb, name))
                 for name in self._SPECS}
        views["block_tables"] = self._upload_table(self.host, self.device, hb.block_tables)
        views["group_block_tables"], views["group_slot_mapping"] = [], []
        for host, device, table, slots in zip(self.group_host, self.group_device,
                                              hb.group_block_tables, hb.group_slot_mappings):
            views["group_block_tables"].append(self._upload_table(host, device, table))
            views["group_slot_mapping"].append(
                self._upload_vector(host, device, "slot_mapping", slots))
        if self.on_cuda:
            self._copied = torch.cuda.Event()
            self._copied.record()
        return views

    @staticmethod
    def _upload_vector(host: dict, device: dict, name: str, values: np.ndarray) -> torch.Tensor:
        """``values`` into the pinned buffer ``host[name]``, then (async) into ``device[name]``;
        returns the device view of its length."""
        n = len(values)
        host[name][:n].numpy()[:] = values
        device[name][:n].copy_(host[name][:n], non_blocking=True)
        return device[name][:n]

    @staticmethod
    def _upload_table(host: dict, device: dict, table: np.ndarray) -> torch.Tensor:
        rows, width = table.shape
        host["block_tables"][:rows, :width].numpy()[:] = table
        device["block_tables"][:rows, :width].copy_(host["block_tables"][:rows, :width],
                                                    non_blocking=True)
        return device["block_tables"][:rows]


@dataclass
class GPUModelInputs(ModelInputs):
    graph_size: int | None = None     # captured batch size to replay, None = eager
    num_tokens: int = 0               # real tokens (padding rows follow them)


class GPUModelRunner(ModelRunner):
    def __init__(self, config: EngineConfig, device: torch.device) -> None:
        super().__init__(config, device)
        if device.type == "cuda":
            logger.info("fused kernels for %d norm/rotary/activation modules",
                        use_fused_kernels(self.model))
        backend = self._attention_backend_name()
        self.use_cuda_graphs = not config.enforce_eager and backend == "triton"
        if not config.enforce_eager and not self.use_cuda_graphs:
            logger.info("CUDA graphs off: the %r attention backend cannot be captured", backend)
        self.graph_sizes = capture_sizes(config.max_num_seqs) if self.use_cuda_graphs else []
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        # --calculate-kv-scales: captured graphs hold the scales as constants, so steps run
        # eager until the first prefill has fixed them, then the graphs are captured again.
        self.kv_scales_pending = scales_pending(self.model)
        self.buffers: StepBuffers | None = None
        self.block_rows: BlockTableRows | None = None
        self.group_rows: list[BlockTableRows] = []     # KV-cache groups 1.. (hybrid models)

    def _attention_backend_name(self) -> str | None:
        from tamis.engine.layers.attention import Attention
        for module in self.model.modules():
            if isinstance(module, Attention):
                return module.backend.name
        return None

    def initialize_kv_cache(self, max_model_len: int, max_num_seqs: int,
                            max_num_batched_tokens: int) -> int:
        num_blocks = super().initialize_kv_cache(max_model_len, max_num_seqs,
                                                 max_num_batched_tokens)
        top = max(self.graph_sizes, default=0)
        max_blocks = -(-max_model_len // self.block_size)
        self.buffers = StepBuffers(max(max_num_batched_tokens, top), max(max_num_seqs, top),
                                   max_blocks, self.device, self.num_kv_groups)
        self.block_rows = BlockTableRows(2 * max_num_seqs, max_blocks)
        self.group_rows = [BlockTableRows(2 * max_num_seqs, max_blocks, g)
                           for g in range(1, self.num_kv_groups)]
        if self.use_cuda_graphs:
            self.capture_graphs()
        return num_blocks

    # --- a step ----------------------------------------------------------------------------

    def prepare_inputs(self, batch: SchedulerOutput,
                       inflight: InflightTokens | None = None) -> GPUModelInputs:
        if self.buffers is None:
            raise RuntimeError("initialize_kv_cache must run before the first step")
        if self.kv_scales_pending and not scales_pending(self.model):
            self._recapture_with_fixed_kv_scales()
        graph_size = None
        if self.graphs and is_graph_step(batch) and not self.kv_scales_pending:
            graph_size = padded_size(len(batch.scheduled), self.graph_sizes)
        hb = build_host_batch(batch, self.block_size, graph_size, self.block_rows, self.group_rows)
        if inflight is not None:
            hb.inflight_rows = np.asarray(inflight.rows, dtype=np.int64)
            hb.inflight_src = np.asarray(inflight.source_rows, dtype=np.int64)
        views = self.buffers.upload(hb)
        if inflight is not None:   # device to device: the ids never visit the host
            views["input_ids"].index_copy_(
                0, views["inflight_rows"], inflight.source.index_select(0, views["inflight_src"]))
        meta = AttentionMetadata(
            query_start_loc=views["query_start_loc"], seq_lens=views["seq_lens"],
            block_tables=views["block_tables"], slot_mapping=views["slot_mapping"],
            max_query_len=max(hb.query_lens), max_seq_len=max(hb.seq_lens_list),
            block_size=self.block_size, query_lens_cpu=hb.query_lens,
            seq_lens_cpu=hb.seq_lens_list)
        group_metadata = [meta] + [
            dataclasses.replace(meta, block_tables=tables, slot_mapping=slots)
            for tables, slots in zip(views["group_block_tables"], views["group_slot_mapping"])]
        return GPUModelInputs(views["input_ids"], views["positions"], meta,
                              views["logits_indices"], hb.prompt_rows, group_metadata,
                              graph_size, hb.num_tokens)

    def forward(self, inputs: ModelInputs) -> torch.Tensor:
        size = getattr(inputs, "graph_size", None)
        if size is None:
            return super().forward(inputs)
        graph, hidden = self.graphs[size]
        graph.replay()
        return hidden[:inputs.num_tokens]

    # --- capture ---------------------------------------------------------------------------

    def _graph_metadata(self, size: int) -> list[AttentionMetadata]:
        """Decode metadata of each KV-cache group over the static buffers' first ``size``
        rows, all padding (a replay reads the tables and slots later uploads write there)."""
        dev = self.buffers.device
        dev["input_ids"][:size].zero_()
        dev["positions"][:size].zero_()
        dev["slot_mapping"][:size].fill_(-1)
        dev["seq_lens"][:size].zero_()
        dev["query_start_loc"][:size + 1].copy_(torch.arange(size + 1, dtype=torch.int32))
        meta = AttentionMetadata(
            query_start_loc=dev["query_start_loc"][:size + 1], seq_lens=dev["seq_lens"][:size],
            block_tables=self.buffers.device["block_tables"][:size],
            slot_mapping=dev["slot_mapping"][:size], max_query_len=1, max_seq_len=1,
            block_size=self.block_size, query_lens_cpu=[1] * size, seq_lens_cpu=[0] * size)
        group_metadata = [meta]
        for group in self.buffers.group_device:
            group["slot_mapping"][:size].fill_(-1)
            group_metadata.append(dataclasses.replace(
                meta, block_tables=group["block_tables"][:size],
                slot_mapping=group["slot_mapping"][:size]))
        return group_metadata

    def _recapture_with_fixed_kv_scales(self) -> None:
        self.kv_scales_pending = False
        if self.graphs:
            self.graphs.clear()
            self.capture_graphs()

    @torch.inference_mode()
    def capture_graphs(self) -> None:
        """Captures the model's forward for every decode size, largest first, one pool."""
        pool = None
        started = time.perf_counter()
        for size in sorted(self.graph_sizes, reverse=True):
            group_metadata = self._graph_metadata(size)
            ids = self.buffers.device["input_ids"][:size]
            positions = self.buffers.device["positions"][:size]
            with forward_context(group_metadata[0], self.kv_caches, group_metadata):
                self.model(ids, positions)        # warm-up: Triton compiles outside capture
                torch.cuda.synchronize(self.device)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    hidden = self.model(ids, positions)
            pool = graph.pool() if pool is None else pool
            self.graphs[size] = (graph, hidden)
        torch.cuda.synchronize(self.device)
        logger.info("captured %d decode CUDA graphs (sizes %s..%s) in %.1f s", len(self.graphs),
                    self.graph_sizes[0], self.graph_sizes[-1], time.perf_counter() - started)


__all__ = ["GPUModelRunner", "BlockTableRows", "use_fused_kernels", "capture_sizes",
           "padded_size", "is_graph_step", "build_host_batch", "HostBatch", "StepBuffers"]
