"""GPUModelRunner: the pure parts on CPU (bucketing, padding, batch layout); the runner
itself (pinned copies, CUDA graphs against eager) on a CUDA device."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from tamis.engine.gpu_runner import (BlockTableRows, build_host_batch, capture_sizes,
                                     is_graph_step, padded_size)
from tamis.engine.runner import ModelRunner
from tamis.engine.scheduler import ScheduledRequest, SchedulerOutput


def needs_cuda(test):
    """Skipped without CUDA, and selected by ``-m gpu``."""
    return pytest.mark.gpu(pytest.mark.skipif(not torch.cuda.is_available(),
                                              reason="needs a CUDA device")(test))


def _item(num_tokens: int, start: int, n: int, block_size: int = 4, prompt_len: int | None = None,
          prompt_logprobs: bool = False, num_groups: int = 1) -> ScheduledRequest:
    """A request with ``num_tokens`` tokens, scheduled for tokens start..start+n-1, with a
    block table in each of ``num_groups`` KV-cache groups (distinct ids)."""
    num_blocks = -(-(start + n) // block_size)
    ids = np.random.permutation(100 * num_groups)[:num_blocks * num_groups] + 1
    tables = [[int(b) for b in ids[g * num_blocks:(g + 1) * num_blocks]] for g in range(num_groups)]
    request = SimpleNamespace(
        all_token_ids=list(np.random.randint(0, 1000, num_tokens)), block_ids=tables[0],
        group_block_ids=tables[1:], num_tokens=num_tokens,
        num_prompt_tokens=prompt_len or num_tokens, wants_prompt_logprobs=prompt_logprobs,
        num_preemptions=0)
    return ScheduledRequest(request, n, start)


def test_capture_sizes():
    assert capture_sizes(256) == [1, 2, 4] + list(range(8, 257, 8))
    assert capture_sizes(3) == [1, 2, 3]
    assert capture_sizes(20) == [1, 2, 4, 8, 16, 20]
    assert capture_sizes(2000)[-1] == 512
    with pytest.raises(ValueError, match="max_num_seqs"):
        capture_sizes(0)


@pytest.mark.parametrize("n,want", [(1, 1), (3, 4), (5, 8), (13, 16), (256, 256), (257, None)])
def test_padded_size(n, want):
    assert padded_size(n, capture_sizes(256)) == want


def test_is_graph_step():
    decode = [_item(10, 9, 1), _item(3, 2, 1)]
    assert is_graph_step(SchedulerOutput(decode))
    assert not is_graph_step(SchedulerOutput(decode + [_item(10, 0, 10)]))   # a prefill chunk
    assert not is_graph_step(SchedulerOutput([_item(10, 4, 1)]))             # does not sample
    assert not is_graph_step(SchedulerOutput([_item(10, 9, 1, prompt_len=11,
                                                    prompt_logprobs=True)]))
    assert not is_graph_step(SchedulerOutput([]))


def _base_layout(batch, block_size, num_groups: int = 1):
    """The plain runner's prepare_inputs on CPU: the layout the GPU runner must reproduce."""
    runner = object.__new__(ModelRunner)
    runner.block_size, runner.device = block_size, torch.device("cpu")
    runner.num_kv_groups = num_groups
    return ModelRunner.prepare_inputs(runner, batch)


@pytest.mark.parametrize("block_size", [4, 16])
def test_host_batch_matches_plain_runner(block_size):
    batch = SchedulerOutput([_item(37, 0, 20, block_size), _item(40, 39, 1, block_size),
                             _item(50, 17, 33, block_size, prompt_len=50, prompt_logprobs=True),
                             _item(9, 8, 1, block_size)])
    hb = build_host_batch(batch, block_size)
    want = _base_layout(batch, block_size)
    meta = want.attn_metadata
    assert hb.input_ids.tolist() == want.input_ids.tolist()
    assert hb.positions.tolist() == want.positions.tolist()
    assert hb.slot_mapping.tolist() == meta.slot_mapping.tolist()
    assert hb.query_start_loc.tolist() == meta.query_start_loc.tolist()
    assert hb.seq_lens.tolist() == meta.seq_lens.tolist()
    assert hb.block_tables.tolist() == meta.block_tables.tolist()
    assert hb.logits_indices.tolist() == want.logits_indices.tolist()
    assert hb.prompt_rows == want.prompt_rows
    assert (hb.query_lens, hb.seq_lens_list) == (meta.query_lens_cpu, meta.seq_lens_cpu)
    assert hb.num_tokens == 55 and hb.num_seqs == 4


@pytest.mark.parametrize("pad_to", [None, 8])
def test_host_batch_of_kv_groups_matches_plain_runner(pad_to):
    """A hybrid model's groups 1..: their tables and slots, kept across steps or rebuilt,
    are the plain runner's per-group metadata (group 0 stays in block_tables)."""
    num_groups = 3
    decode = pad_to is not None
    batch = SchedulerOutput([_item(37, 36 if decode else 0, 1 if decode else 37, num_groups=num_groups),
                             _item(40, 39, 1, num_groups=num_groups),
                             _item(9, 8, 1, num_groups=num_groups)])
    want = _base_layout(batch, 4, num_groups)
    rows = [BlockTableRows(8, 16, g) for g in range(1, num_groups)]
    for group_rows in (None, rows, rows):   # rebuilt, then kept rows twice
        hb = build_host_batch(batch, 4, pad_to, BlockTableRows(8, 16) if group_rows else None,
                              group_rows or [BlockTableRows(8, 16, g) for g in range(1, num_groups)])
        seqs, tokens = hb.num_seqs, hb.num_tokens
        assert len(hb.group_block_tables) == len(hb.group_slot_mappings) == num_groups - 1
        assert hb.block_tables[:seqs].tolist() == want.group_metadata[0].block_tables.tolist()
        for g in range(1, num_groups):
            meta = want.group_metadata[g]
            assert hb.group_block_tables[g - 1][:seqs].tolist() == meta.block_tables.tolist()
            assert hb.group_slot_mappings[g - 1][:tokens].tolist() == meta.slot_mapping.tolist()
            assert (hb.group_slot_mappings[g - 1][tokens:] == -1).all()
            assert meta.seq_lens is want.attn_metadata.seq_lens   # shared layout
        assert hb.slot_mapping[:tokens].tolist() != hb.group_slot_mappings[0][:tokens].tolist()


def test_decode_padding_rows():
    batch = SchedulerOutput([_item(10, 9, 1), _item(30, 29, 1), _item(5, 4, 1)])
    hb = build_host_batch(batch, 4, pad_to=8)
    assert hb.input_ids.shape == (8,) and hb.num_tokens == 3 and hb.num_seqs == 3
    assert hb.slot_mapping[3:].tolist() == [-1] * 5, "padding stores nothing"
    assert hb.seq_lens.tolist()[3:] == [0] * 5, "padding attends to nothing"
    assert hb.seq_lens.tolist()[:3] == [10, 30, 5]
    assert hb.query_start_loc.tolist() == list(range(9)), "one token per row"
    assert hb.positions[:3].tolist() == [9, 29, 4] and hb.positions[3:].tolist() == [0] * 5
    assert hb.logits_indices.tolist() == [0, 1, 2]
    assert hb.block_tables.shape[0] == 8 and not hb.block_tables[3:].any()
    first = batch.scheduled[0]
    assert hb.slot_mapping[0] == first.block_ids[9 // 4] * 4 + 9 % 4
    with pytest.raises(ValueError, match="pad_to"):
        build_host_batch(batch, 4, pad_to=2)


def _tokenizer_free_checkpoint(folder) -> str:
    """A tiny random Llama without tokenizer files (the GPU machine lacks the embedded
    model that the shared fixture copies them from)."""
    import transformers
    config = transformers.LlamaConfig(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, initializer_range=0.2,
        max_position_embeddings=1024)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    return str(folder)


def test_block_table_rows_track_growth_preemption_and_reuse():
    """Kept rows give the same tables as a rebuild, step after step: blocks appended,
    a request preempted and reallocated, rows recycled for new requests."""
    cache = BlockTableRows(num_rows=4, max_blocks=32)
    items = [_item(10, 9, 1), _item(20, 19, 1), _item(7, 6, 1)]
    rng = np.random.default_rng()
    for step in range(12):
        for item in items:
            if rng.random() < 0.4:
                item.request.block_ids.append(int(rng.integers(100, 200)))
        if step == 5:   # preemption: blocks freed, then reallocated from scratch
            count = len(items[1].request.block_ids)
            items[1].request.block_ids = [int(b) for b in rng.integers(300, 400, count)]
            items[1].request.num_preemptions += 1
        if step in (3, 7):   # a request finishes, a new one takes a recycled row
            items[step % 3] = _item(9, 8, 1)
        batch = SchedulerOutput(items)
        got = build_host_batch(batch, 4, pad_to=4, block_rows=cache)
        want = build_host_batch(batch, 4, pad_to=4)
        assert np.array_equal(got.block_tables, want.block_tables), step
        assert np.array_equal(got.slot_mapping, want.slot_mapping), step


@needs_cuda
def test_cuda_graphs_match_eager(tmp_path):
    """Greedy tokens with decode graphs equal those of the eager runner on a tiny model."""
    from tamis.engine.llm import LLM
    from tamis.engine.sampling_params import SamplingParams
    path = _tokenizer_free_checkpoint(tmp_path)
    prompts = [[1, 5, 9, 200 + i] * (i + 1) for i in range(11)]
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, detokenize=False)
    outs = {}
    for eager in (True, False):
        llm = LLM(model=path, dtype="float32", enforce_eager=eager, max_num_seqs=16,
                  gpu_memory_utilization=0.3, skip_tokenizer_init=True)
        runner = llm.llm_engine.runner
        assert bool(runner.graphs) != eager, "graphs exactly when not eager"
        outs[eager] = [o.outputs[0].token_ids for o in llm.generate(
            [{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)]
        del llm, runner
    assert outs[True] == outs[False]


def test_fused_kernels_keep_the_model_function(tmp_path):
    """use_fused_kernels swaps norm/rotary/activation forwards; outputs stay the same
    (on CPU the dispatchers run the torch references, on CUDA the Triton kernels)."""
    from tamis.engine.attention.metadata import forward_context
    from tamis.engine.config import EngineConfig
    from tamis.engine.gpu_runner import use_fused_kernels
    from tamis.engine.loader import load_model
    torch.set_num_threads(2)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    config = EngineConfig(model=_tokenizer_free_checkpoint(tmp_path), dtype="float32",
                          skip_tokenizer_init=True)
    model, _ = load_model(config, device)
    ids = torch.randint(0, 512, (23,), device=device)
    positions = torch.arange(23, device=device)
    with torch.inference_mode(), forward_context(None, []):
        want = model(ids, positions)
        assert use_fused_kernels(model) == 2 * 2 + 1 + 2 + 2   # norms, rotary, activations
        got = model(ids, positions)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def _generate(monkeypatch, checkpoint, use_gpu_runner: bool, triton_attention: bool):
    from tamis.engine import engine as engine_module
    from tamis.engine.attention.triton_backend import TritonAttentionBackend
    from tamis.engine.gpu_runner import GPUModelRunner
    from tamis.engine.layers.attention import Attention
    from tamis.engine.llm import LLM
    from tamis.engine.sampling_params import SamplingParams
    if use_gpu_runner:
        monkeypatch.setattr(engine_module, "make_runner", GPUModelRunner)
    # device="cpu" on a GPU machine too: the kernels run interpreted, and the two greedy
    # runs compare the runners, not cuBLAS's and Triton's roundings at a tiny model's ties.
    llm = LLM(model=str(checkpoint), device="cpu", enforce_eager=True, max_num_seqs=4,
              max_num_batched_tokens=16, kv_cache_memory_bytes="4MiB")
    monkeypatch.undo()
    if triton_attention:   # kernels run under the Triton interpreter on CPU
        for module in llm.llm_engine.runner.model.modules():
            if isinstance(module, Attention):
                module.backend = TritonAttentionBackend(decode_num_splits=2)
    prompts = [[1, 7, 9, 4, 2, 8, 3] * 3, [5, 6], [9] * 5]   # 21 tokens: chunked prefill
    params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True, detokenize=False)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return llm, [o.outputs[0].token_ids for o in outs]


def test_gpu_runner_on_cpu_matches_plain_runner(monkeypatch, tiny_checkpoint):
    """The GPU runner's step buffers and the Triton backend (interpreted) end to end on CPU:
    chunked prefill, mixed and decode-only steps give the plain runner's greedy tokens."""
    torch.set_num_threads(2)
    path = tiny_checkpoint("llama")
    _, want = _generate(monkeypatch, path, use_gpu_runner=False, triton_attention=False)
    llm, got = _generate(monkeypatch, path, use_gpu_runner=True, triton_attention=True)
    assert type(llm.llm_engine.runner).__name__ == "GPUModelRunner"
    assert got == want
