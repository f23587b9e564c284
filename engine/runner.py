"""The model runner: owns the model and the KV tensors, turns a scheduled step into logits.

It knows nothing of requests' history: each ``ScheduledRequest`` says which tokens to
compute (``token_ids`` at positions ``start..``), where their KV goes (``block_ids``, and
``group_block_ids`` for the other KV-cache groups of a hybrid model: ``kv_groups.py``),
whether the step samples it, and how many prompt-logprob rows it wants. One step::

    prepare_inputs(batch, inflight)
                            -> ModelInputs (flat token ids, positions, AttentionMetadata,
                               rows of the hidden states whose logits are needed)
    forward(inputs)         -> hidden [T, H]   (under forward_context)
    compute_logits          -> sampling rows [S, V] + prompt-logprob rows per request
    sample(logits, ...)     -> SampledTokens: ids on the device, copies to the host queued

Nothing in a step waits for the device until the engine reads the sampled ids
(``SampledTokens.result()``), so the engine can queue the next step first. A token
sampled by a step still running is "in flight": the next step's input row for it is
written on the device from the previous step's ids (``InflightTokens``).

Subclasses (the GPU runner with CUDA graphs) override ``prepare_inputs``, ``forward``
or ``sample``; ``make_runner`` picks ``tamis.engine.gpu_runner.GPUModelRunner`` on CUDA
when that module exists.

KV cache sizing: ``num_gpu_blocks_override`` when given; else ``kv_cache_memory_bytes``
(CPU default 512 MiB); else, on GPU, what ``gpu_memory_utilization`` leaves after a
profiling forward pass of a full token budget. Never more blocks than
``max_num_seqs`` full-length sequences could use.
"""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field

import torch

from tamis.engine.attention.kv_scales import calculate_on_first_prefill
from tamis.engine.attention.metadata import AttentionMetadata, forward_context
from tamis.engine.config import (DEFAULT_CPU_KV_CACHE_BYTES, EngineConfig, resolve_dtype,
                                 resolve_kv_cache_dtype)
from tamis.engine.sampler import SampledTokens, Sampler, SamplingMetadata
from tamis.engine.scheduler import SchedulerOutput

logger = logging.getLogger(__name__)


@dataclass
class ModelInputs:
    input_ids: torch.Tensor           # int64 [T]
    positions: torch.Tensor           # int64 [T]
    attn_metadata: AttentionMetadata
    logits_indices: torch.Tensor      # int64 [S]: rows of hidden whose logits sample
    prompt_rows: list[tuple[int, int, int]] = field(default_factory=list)
    # (index in batch.scheduled, first row in hidden, number of rows) for prompt logprobs
    group_metadata: list[AttentionMetadata] | None = None
    # one per KV-cache group (block tables and slots differ), [0] being attn_metadata


@dataclass
class InflightTokens:
    """Input tokens whose ids are still on the device: flat input row ``rows[i]`` takes
    ``source[source_rows[i]]`` (``source``: the previous step's sampled ids)."""
    rows: list[int]
    source_rows: list[int]
    source: torch.Tensor


@dataclass
class RunnerOutput:
    sample_logits: torch.Tensor                 # float32 [S, V], in batch order of samplers
    prompt_logits: dict[int, torch.Tensor]      # batch index -> float32 [rows, V]


class ModelRunner:
    def __init__(self, config: EngineConfig, device: torch.device) -> None:
        from tamis.engine.loader import kv_cache_spec, load_model

        self.config = config
        self.device = device
        self.model, self.hf_config = load_model(config, device)
        if config.calculate_kv_scales:
            calculate_on_first_prefill(self.model, config.kv_cache_dtype)
        self.model_dir = self.model.model_dir
        self.dtype = getattr(self.model, "dtype", None) or resolve_dtype(config.dtype, device, self.hf_config)
        self.hybrid_kv = not getattr(config, "disable_hybrid_kv_cache_manager", False)
        self.kv_spec = kv_cache_spec(self.hf_config, hybrid=self.hybrid_kv)
        self.num_kv_groups = len(self.kv_spec.groups)
        assign_kv_groups(self.model, self.kv_spec)
        self.block_size = config.block_size
        self.vocab_size = int(self.hf_config.vocab_size)
        self.kv_cache_dtype = resolve_kv_cache_dtype(config.kv_cache_dtype, self.dtype, device)
        self.kv_caches: list[torch.Tensor] = []
        self.sampler = Sampler()

    # --- KV cache -------------------------------------------------------------------------

    def initialize_kv_cache(self, max_model_len: int, max_num_seqs: int,
                            max_num_batched_tokens: int) -> int:
        """Sizes and allocates the per-layer KV tensors; returns the number of blocks."""
        num_blocks = self.determine_num_blocks(max_model_len, max_num_seqs, max_num_batched_tokens)
        self.kv_caches = self.allocate_kv_tensors(num_blocks)
        logger.info("KV cache: %d blocks of %d tokens (%.1f MiB), %d group(s) of layers",
                    num_blocks, self.block_size, num_blocks * self.block_bytes / 2**20,
                    self.num_kv_groups)
        return num_blocks

    def allocate_kv_tensors(self, num_blocks: int) -> list[torch.Tensor | None]:
        """One tensor per cache slot this rank holds (``kv_groups.py``); returns each
        layer's (the same tensor for the layers of one slot, None for another stage's)."""
        spec = self.kv_spec
        shape = (2, num_blocks, self.block_size, spec.num_kv_heads, spec.head_dim)
        # Zeros, not garbage: padded rows of a block table read block contents that the
        # attention masks out, and masked NaNs would still poison the weighted sum.
        tensors = {slot: torch.zeros(shape, dtype=self.kv_cache_dtype, device=self.device)
                   for slot in spec.cached_slots}
        return [tensors[spec.layer_slots[layer][1]] if layer in spec.layers else None
                for layer in range(spec.num_layers)]

    @property
    def block_bytes(self) -> int:
        return self.kv_spec.block_bytes(self.block_size, self.kv_cache_dtype)

    def determine_num_blocks(self, max_model_len: int, max_num_seqs: int,
                             max_num_batched_tokens: int) -> int:
        if self.config.num_gpu_blocks_override is not None:
            return self.config.num_gpu_blocks_override
        budget = self.config.kv_cache_memory_bytes
        if budget is None:
            budget = (self.profile_kv_budget(max_num_batched_tokens) if self.device.type == "cuda"
                      else DEFAULT_CPU_KV_CACHE_BYTES)
        useful = max_num_seqs * -(-max_model_len // self.block_size) * self.num_kv_groups
        num_blocks = min(budget // self.block_bytes, useful)
        if num_blocks < 1:
            raise ValueError(f"the KV cache budget ({budget} bytes) holds no block of "
                             f"{self.block_bytes} bytes: raise --kv-cache-memory or "
                             f"--gpu-memory-utilization")
        return int(num_blocks)

    @torch.inference_mode()
    def profile_kv_budget(self, max_num_batched_tokens: int) -> int:
        """GPU bytes left for the KV cache after a forward pass over a full token budget."""
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)
        ids = torch.zeros(max_num_batched_tokens, dtype=torch.int64, device=self.device)
        positions = torch.arange(max_num_batched_tokens, device=self.device)
        with forward_context(None, []):
            hidden = self.model(ids, positions)
        self.model.compute_logits(hidden[-min(len(hidden), self.config.max_num_seqs):])
        torch.cuda.synchronize(self.device)
        activation_peak = torch.cuda.max_memory_allocated(self.device) - torch.cuda.memory_allocated(self.device)
        free, total = torch.cuda.mem_get_info(self.device)
        budget = int(total * self.config.gpu_memory_utilization - (total - free) - activation_peak)
        if budget <= 0:
            raise ValueError(f"no GPU memory left for the KV cache at --gpu-memory-utilization "
                             f"{self.config.gpu_memory_utilization}: raise it or lower "
                             f"--max-num-batched-tokens")
        return budget

    # --- one step ---------------------------------------------------------------------------

    @torch.inference_mode()
    def execute_model(self, batch: SchedulerOutput,
                      inflight: InflightTokens | None = None) -> RunnerOutput:
        inputs = self.prepare_inputs(batch, inflight)
        hidden = self.forward(inputs)
        return self.compute_logits(hidden, inputs)

    def prepare_inputs(self, batch: SchedulerOutput,
                       inflight: InflightTokens | None = None) -> ModelInputs:
        """Flattens the scheduled chunks, request after request (layout in attention/metadata.py)."""
        bs = self.block_size
        num_groups = self.num_kv_groups
        token_ids: list[int] = []
        positions: list[int] = []
        group_slots: list[list[int]] = [[] for _ in range(num_groups)]
        query_lens, seq_lens, sample_rows = [], [], []
        prompt_rows: list[tuple[int, int, int]] = []
        for index, item in enumerate(batch.scheduled):
            first_row = len(token_ids)
            span = range(item.start, item.start + item.num_new_tokens)
            token_ids.extend(item.token_ids)
            positions.extend(span)
            for slots, block_ids in zip(group_slots, (item.block_ids, *item.group_block_ids)):
                slots.extend(block_ids[p // bs] * bs + p % bs for p in span)
            query_lens.append(item.num_new_tokens)
            seq_lens.append(item.start + item.num_new_tokens)
            if item.num_prompt_logprob_rows:
                prompt_rows.append((index, first_row, item.num_prompt_logprob_rows))
            if item.samples:
                sample_rows.append(len(token_ids) - 1)
        max_blocks = max(len(item.block_ids) for item in batch.scheduled)
        tables = [item.block_ids + [0] * (max_blocks - len(item.block_ids)) for item in batch.scheduled]
        group_metadata = [self._attention_metadata(query_lens, seq_lens, tables, group_slots[0])]
        for g in range(1, num_groups):   # other groups: the same layout over their own blocks
            tables = [table + [0] * (max_blocks - len(table))
                      for table in (item.group_block_ids[g - 1] for item in batch.scheduled)]
            group_metadata.append(dataclasses.replace(
                group_metadata[0], block_tables=torch.tensor(tables, dtype=torch.int32, device=self.device),
                slot_mapping=torch.tensor(group_slots[g], dtype=torch.int64, device=self.device)))
        as_long = lambda values: torch.tensor(values, dtype=torch.int64, device=self.device)  # noqa: E731
        input_ids = as_long(token_ids)
        if inflight is not None:
            input_ids[as_long(inflight.rows)] = inflight.source[as_long(inflight.source_rows)]
        return ModelInputs(input_ids, as_long(positions), group_metadata[0], as_long(sample_rows),
                           prompt_rows, group_metadata)

    def _attention_metadata(self, query_lens: list[int], seq_lens: list[int],
                            tables: list[list[int]], slots: list[int]) -> AttentionMetadata:
        as_i32 = lambda values: torch.tensor(values, dtype=torch.int32, device=self.device)  # noqa: E731
        starts = [0]
        for n in query_lens:
            starts.append(starts[-1] + n)
        return AttentionMetadata(
            query_start_loc=as_i32(starts), seq_lens=as_i32(seq_lens), block_tables=as_i32(tables),
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=self.device),
            max_query_len=max(query_lens), max_seq_len=max(seq_lens), block_size=self.block_size,
            query_lens_cpu=query_lens, seq_lens_cpu=seq_lens)

    def forward(self, inputs: ModelInputs) -> torch.Tensor:
        with forward_context(inputs.attn_metadata, self.kv_caches, inputs.group_metadata):
            return self.model(inputs.input_ids, inputs.positions)

    def compute_logits(self, hidden: torch.Tensor, inputs: ModelInputs) -> RunnerOutput:
        """Logits only for the rows that need them: one lm_head call over all of them."""
        logits = self.model.compute_logits(hidden[self.logit_rows(inputs)]).float()
        return self.split_logits(logits, inputs)

    @staticmethod
    def logit_rows(inputs: ModelInputs) -> torch.Tensor:
        """The rows of the hidden states whose logits the step needs: the sampling rows,
        then each request's prompt-logprob rows."""
        pieces = [inputs.logits_indices]
        device = inputs.logits_indices.device
        for _, first, count in inputs.prompt_rows:
            pieces.append(torch.arange(first, first + count, device=device))
        return torch.cat(pieces) if len(pieces) > 1 else pieces[0]

    @staticmethod
    def split_logits(logits: torch.Tensor, inputs: ModelInputs) -> RunnerOutput:
        """The logits of ``logit_rows`` as sampling rows and per-request prompt rows."""
        num_sample = inputs.logits_indices.numel()
        prompt_logits, offset = {}, num_sample
        for index, _, count in inputs.prompt_rows:
            prompt_logits[index] = logits[offset:offset + count]
            offset += count
        return RunnerOutput(logits[:num_sample], prompt_logits)

    @torch.inference_mode()
    def sample(self, logits: torch.Tensor, meta: SamplingMetadata,
               bitmask: torch.Tensor | None = None,
               bitmask_rows: list[int] | None = None) -> SampledTokens:
        """Samples on the device; ``.result()`` of the return value waits for the ids."""
        return SampledTokens(*self.sampler.sample_on_device(logits, meta, bitmask, bitmask_rows))


def assign_kv_groups(model: torch.nn.Module, spec) -> None:
    """Tells each attention layer its KV-cache group, whose metadata (block table, slots)
    it reads (``kv_groups.py``)."""
    from tamis.engine.layers.attention import Attention
    for module in model.modules():
        if isinstance(module, Attention):
            module.kv_group = spec.layer_slots[module.layer_idx][0]


def make_runner(config: EngineConfig, device: torch.device) -> ModelRunner:
    """``GPUModelRunner`` (CUDA graphs) on CUDA when available, else the plain runner;
    with ``tensor_parallel_size`` or ``pipeline_parallel_size`` above 1, rank 0's runner of a
    multi-process engine (eager, on CUDA too: ``tamis.engine.distributed.runner``)."""
    if config.tensor_parallel_size > 1 or config.pipeline_parallel_size > 1:
        from tamis.engine.distributed.runner import DriverRunner
        return DriverRunner(config, device)
    if device.type == "cuda":
        try:
            from tamis.engine.gpu_runner import GPUModelRunner
        except ImportError as exc:
            logger.info("GPU runner unavailable (%s); using the eager runner", exc)
        else:
            return GPUModelRunner(config, device)
    return ModelRunner(config, device)


__all__ = ["ModelRunner", "ModelInputs", "RunnerOutput", "InflightTokens", "make_runner"]
