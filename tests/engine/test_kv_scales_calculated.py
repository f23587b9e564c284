"""--calculate-kv-scales: FP8 KV-cache scales measured on the first prefill, then fixed;
checkpoint scales win; ignored (with a warning) by other caches; the torch and Triton
backends store and read with the measured scales; greedy output stays near fp32's."""
from __future__ import annotations

import logging
import shutil

import pytest
import torch
from safetensors.torch import save_file

from engine_helpers import make_engine, random_prompts, run_to_completion
from tamis.engine.arg_utils import add_engine_args
from tamis.engine.attention.kv_rotation import random_hadamard
from tamis.engine.attention.kv_scales import K_SCALE_RANGE, V_SCALE_RANGE, measure_scales
from tamis.engine.attention.metadata import AttentionMetadata, forward_context
from tamis.engine.config import EngineConfig
from tamis.engine.layers.attention import Attention
from tamis.engine.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, detokenize=False)


def _attentions(engine) -> list[Attention]:
    return [m for m in engine.runner.model.modules() if isinstance(m, Attention)]


def _record_first_kv(engine) -> list[list]:
    """Per layer, the (k, v) of every forward call, filled as the engine runs."""
    seen = [[] for _ in _attentions(engine)]
    for i, attention in enumerate(_attentions(engine)):
        def hook(module, args, i=i):
            seen[i].append((args[1].clone(), args[2].clone()))
        attention.register_forward_pre_hook(hook)
    return seen


def test_the_flag_reaches_the_config():
    import argparse
    args = add_engine_args(argparse.ArgumentParser()).parse_args(
        ["--kv-cache-dtype", "fp8", "--calculate-kv-scales"])
    assert EngineConfig.from_cli_args(args).calculate_kv_scales is True
    assert EngineConfig().calculate_kv_scales is False


def test_scales_are_measured_on_the_first_prefill_then_fixed(tiny_checkpoint):
    engine = make_engine(tiny_checkpoint("llama"), kv_cache_dtype="fp8", calculate_kv_scales=True)
    layers = _attentions(engine)
    assert all(a.calculate_kv_scales and (a.k_scale, a.v_scale) == (1.0, 1.0) for a in layers)
    assert all(torch.equal(a.kv_rotation, random_hadamard(16)) for a in layers)   # head_dim 16
    seen = _record_first_kv(engine)
    first, later = random_prompts((40,), seed=1), random_prompts((90, 7), seed=2)
    run_to_completion(engine, first, GREEDY)
    measured = [(a.k_scale, a.v_scale) for a in layers]
    for attention, calls in zip(layers, seen):
        rotation = attention.kv_rotation
        k, v = (t @ rotation for t in calls[0])   # what the layer stores: rotated...
        assert not attention.calculate_kv_scales
        torch.testing.assert_close(attention.key_shift, k.mean(0))
        torch.testing.assert_close(attention.value_shift, v.mean(0))
        shifted = k - k.mean(0)                   # ...and less their means
        assert attention.k_scale == pytest.approx(float(shifted.abs().max()) / K_SCALE_RANGE)
        assert attention.v_scale == pytest.approx(float((v - v.mean(0)).abs().max()) / V_SCALE_RANGE)
        assert attention.k_scale != 1.0 and attention.v_scale != 1.0
    # Later batches (longer prompts, decodes) leave them as they are.
    outs = run_to_completion(engine, later, GREEDY, prefix="later")
    assert [(a.k_scale, a.v_scale) for a in layers] == measured
    assert all(torch.equal(a.key_shift, (calls[0][0] @ a.kv_rotation).mean(0))
               for a, calls in zip(layers, seen))
    assert all(len(o.outputs[0].token_ids) == 8 for o in outs)


def test_passes_that_store_nothing_measure_nothing():
    """Profiling (no metadata) and CUDA-graph capture (every slot -1, lengths 0) leave the
    layer waiting; padding rows (slot -1) of a real pass are left out of the amax."""
    from tamis.engine.attention.torch_backend import TorchAttentionBackend
    attention = Attention(4, 16, 2, layer_idx=0, scale=0.25, backend=TorchAttentionBackend())
    attention.calculate_kv_scales = True
    cache = torch.zeros(2, 4, 4, 2, 16, dtype=torch.float8_e4m3fn)
    q, k, v = torch.randn(3, 4, 16), torch.randn(3, 2, 16), torch.randn(3, 2, 16)
    with forward_context(None, [cache]):
        attention(q, k, v)
    capture = _decode_metadata(slots=[-1, -1, -1], seq_lens=[0, 0, 0])
    with forward_context(capture, [cache]):
        attention(q, k, v)
    assert attention.calculate_kv_scales and attention.k_scale == 1.0
    k[1] *= 1000   # a padding row: must not set the scale
    with forward_context(_decode_metadata(slots=[0, -1, 9], seq_lens=[1, 0, 2]), [cache]):
        attention(q, k, v)
    assert not attention.calculate_kv_scales
    real = k[[0, 2]]
    torch.testing.assert_close(attention.key_shift, real.mean(0))
    assert attention.k_scale == pytest.approx(float((real - real.mean(0)).abs().max()) / K_SCALE_RANGE)


def _decode_metadata(slots: list[int], seq_lens: list[int]) -> AttentionMetadata:
    n = len(slots)
    return AttentionMetadata(
        query_start_loc=torch.arange(n + 1, dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        block_tables=torch.arange(n, dtype=torch.int32)[:, None],
        slot_mapping=torch.tensor(slots), max_query_len=1, max_seq_len=max(seq_lens),
        block_size=4, query_lens_cpu=[1] * n, seq_lens_cpu=seq_lens)


def test_measure_scales_of_an_all_zero_batch_is_one():
    zeros = torch.zeros(5, 2, 8)
    assert measure_scales(zeros, zeros, torch.arange(5)) == (1.0, 1.0)


def test_checkpoint_scales_win(tiny_checkpoint, tmp_path):
    folder = tmp_path / "scaled"
    shutil.copytree(tiny_checkpoint("llama"), folder)
    save_file({"model.layers.0.self_attn.k_scale": torch.tensor(0.03),
               "model.layers.0.self_attn.v_scale": torch.tensor(0.02)},
              str(folder / "kv_scales.safetensors"))
    engine = make_engine(folder, kv_cache_dtype="fp8", calculate_kv_scales=True)
    first, second = _attentions(engine)
    assert not first.calculate_kv_scales and second.calculate_kv_scales
    assert first.kv_rotation is None and second.kv_rotation is not None
    run_to_completion(engine, random_prompts((30,)), GREEDY)
    assert (first.k_scale, first.v_scale) == (pytest.approx(0.03), pytest.approx(0.02))
    assert not second.calculate_kv_scales and second.k_scale != 1.0


def test_other_caches_ignore_the_flag_with_a_warning(tiny_checkpoint, caplog):
    prompts = random_prompts((12, 33))
    with caplog.at_level(logging.WARNING, logger="tamis.engine.attention.kv_scales"):
        engine = make_engine(tiny_checkpoint("llama"), calculate_kv_scales=True)
    assert "--calculate-kv-scales has no effect with --kv-cache-dtype auto" in caplog.text
    got = run_to_completion(engine, prompts, GREEDY)
    assert all(not a.calculate_kv_scales and a.k_scale == 1.0 for a in _attentions(engine))
    want = run_to_completion(make_engine(tiny_checkpoint("llama")), prompts, GREEDY)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in want]


def test_triton_backend_stores_and_reads_with_the_measured_scales():
    """One prefill of two sequences through each backend (Triton interpreted on CPU): the
    same scales, the same cache bytes, outputs within fp8's error of each other."""
    from tamis.engine.attention.torch_backend import TorchAttentionBackend
    from tamis.engine.attention.triton_backend import TritonAttentionBackend
    torch.manual_seed(0)
    lens, heads, kv_heads, dim, block = [5, 7], 4, 2, 16, 4
    q = torch.randn(sum(lens), heads, dim)
    k, v = torch.randn(sum(lens), kv_heads, dim) * 3, torch.randn(sum(lens), kv_heads, dim) * 0.01
    meta = AttentionMetadata(
        query_start_loc=torch.tensor([0, 5, 12], dtype=torch.int32),
        seq_lens=torch.tensor(lens, dtype=torch.int32),
        block_tables=torch.tensor([[0, 1], [2, 3]], dtype=torch.int32),
        slot_mapping=torch.cat([torch.arange(5), torch.arange(8, 15)]), max_query_len=7,
        max_seq_len=7, block_size=block, query_lens_cpu=lens, seq_lens_cpu=lens)
    outs, caches, scales = {}, {}, {}
    for name, backend in (("torch", TorchAttentionBackend()), ("triton", TritonAttentionBackend())):
        attention = Attention(heads, dim, kv_heads, layer_idx=0, scale=dim ** -0.5, backend=backend)
        attention.calculate_kv_scales, attention.kv_rotation = True, random_hadamard(dim)
        caches[name] = torch.zeros(2, 4, block, kv_heads, dim, dtype=torch.float8_e4m3fn)
        with forward_context(meta, [caches[name]]):
            outs[name] = attention(q, k, v)
        scales[name] = (attention.k_scale, attention.v_scale)
    assert scales["torch"] == scales["triton"]
    stored = k @ random_hadamard(dim)
    assert scales["torch"][0] == pytest.approx(float((stored - stored.mean(0)).abs().max())
                                               / K_SCALE_RANGE)
    assert torch.equal(caches["torch"].view(torch.uint8), caches["triton"].view(torch.uint8))
    torch.testing.assert_close(outs["triton"], outs["torch"], atol=1e-4, rtol=1e-3)
    # Values of 0.01 are far below e4m3's normal range at a unit scale: read back with the
    # measured scale they keep ~2 significant digits.
    want = _exact_attention(q, k, v, lens, dim ** -0.5)
    torch.testing.assert_close(outs["torch"].view_as(want), want, atol=2e-3, rtol=0.1)


def test_random_hadamard_is_orthogonal_and_fixed():
    for dim in (16, 64, 128):
        r = random_hadamard(dim)
        torch.testing.assert_close(r @ r.T, torch.eye(dim), atol=1e-6, rtol=0)
        assert torch.equal(r, random_hadamard(dim))
        assert (r.abs() - dim ** -0.5).abs().max() < 1e-6   # every channel takes a share
    assert random_hadamard(80) is None and random_hadamard(96) is None


@pytest.mark.parametrize("soft_cap", [None, 20.0])
def test_rotation_and_shifts_leave_attention_unchanged(soft_cap):
    """Rotated q/k/v, keys and values stored less their means (fp32 cache, so nothing is
    rounded): prefill over a cached prefix and decode give the plain outputs; a soft-capped
    layer takes no key shift (tanh would not ignore it) but its values are shifted."""
    from tamis.engine.attention.torch_backend import TorchAttentionBackend
    torch.manual_seed(1)
    heads, kv_heads, dim, block = 4, 2, 16, 4
    k_all = torch.randn(9, kv_heads, dim) + torch.randn(kv_heads, dim) * 5   # a large mean
    v_all = torch.randn(9, kv_heads, dim) + torch.randn(kv_heads, dim) * 3
    q_all = torch.randn(9, heads, dim)
    steps = [(0, 6), (6, 8), (8, 9)]   # a prefill chunk, a chunk over its prefix, a decode
    outs = {}
    for shifted in (False, True):
        attention = Attention(heads, dim, kv_heads, layer_idx=0, scale=dim ** -0.5,
                              backend=TorchAttentionBackend(), soft_cap=soft_cap)
        if shifted:   # as the flag and the first measured pass set them
            attention.kv_rotation = random_hadamard(dim)
            rotation = attention.kv_rotation
            attention._measure_kv(k_all[:6] @ rotation, v_all[:6] @ rotation, torch.arange(6))
            assert (attention.key_shift is None) == (soft_cap is not None)
            assert attention.value_shift is not None
        cache = torch.zeros(2, 3, block, kv_heads, dim)
        outs[shifted] = []
        for start, end in steps:
            meta = AttentionMetadata(
                query_start_loc=torch.tensor([0, end - start], dtype=torch.int32),
                seq_lens=torch.tensor([end], dtype=torch.int32),
                block_tables=torch.tensor([[0, 1, 2]], dtype=torch.int32),
                slot_mapping=torch.arange(start, end), max_query_len=end - start,
                max_seq_len=end, block_size=block, query_lens_cpu=[end - start],
                seq_lens_cpu=[end])
            with forward_context(meta, [cache]):
                outs[shifted].append(attention(q_all[start:end], k_all[start:end], v_all[start:end]))
        if shifted and soft_cap is None:
            stored = cache[0].flatten(0, 1)[:9]
            torch.testing.assert_close(stored, k_all @ attention.kv_rotation - attention.key_shift)
        if shifted:
            stored = cache[1].flatten(0, 1)[:9]
            torch.testing.assert_close(stored, v_all @ attention.kv_rotation - attention.value_shift)
    torch.testing.assert_close(torch.cat(outs[True]), torch.cat(outs[False]), atol=1e-5, rtol=1e-5)


def _exact_attention(q, k, v, lens, scale):
    outs, start = [], 0
    for n in lens:
        s = slice(start, start + n)
        kk, vv = (t[s].repeat_interleave(q.shape[1] // k.shape[1], dim=1) for t in (k, v))
        scores = torch.einsum("qhd,khd->hqk", q[s], kk) * scale
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        outs.append(torch.einsum("hqk,khd->qhd", scores.softmax(-1), vv))
        start += n
    return torch.cat(outs)


def test_greedy_output_stays_near_fp32(tiny_checkpoint):
    """Tiny Llama in fp32, cache in fp32 against fp8 with measured scales: prompt logprobs
    stay within e4m3's rounding (mean change 0.03 nats measured), and every first greedy
    token of the fp8 run is fp32's choice or within 0.15 nats of it (this random model's
    top logits nearly tie, so later tokens may part ways)."""
    path = tiny_checkpoint("llama")
    prompts = random_prompts((16, 40, 75, 120), seed=3)
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, detokenize=False,
                            prompt_logprobs=0, logprobs=5)
    runs = {}
    for kv_dtype in ("auto", "fp8"):
        engine = make_engine(path, kv_cache_dtype=kv_dtype, calculate_kv_scales=True,
                             max_num_batched_tokens=64, max_num_seqs=4)
        runs[kv_dtype] = run_to_completion(engine, prompts, params)
    changes = torch.tensor([abs(fp8.prompt_logprobs[i][token].logprob
                                - full.prompt_logprobs[i][token].logprob)
                            for fp8, full, prompt in zip(runs["fp8"], runs["auto"], prompts)
                            for i, token in enumerate(prompt) if i])
    assert 0 < changes.mean() <= 0.06 and changes.max() <= 0.3, changes
    for fp8, full in zip(runs["fp8"], runs["auto"]):
        first = full.outputs[0].logprobs[0]          # fp32's top-5 at the first new token
        chosen = fp8.outputs[0].token_ids[0]
        best = max(entry.logprob for entry in first.values())
        assert chosen in first and first[chosen].logprob >= best - 0.15, (chosen, first)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_decode_graphs_are_captured_again_with_the_measured_scales(tmp_path):
    """Graphs captured before the first prefill hold unit scales: the runner steps eagerly
    until the scales are measured, then captures again, and gives the eager runner's tokens."""
    from test_gpu_runner import _tokenizer_free_checkpoint
    from tamis.engine.llm import LLM
    path = _tokenizer_free_checkpoint(tmp_path)
    prompts = [[1, 5, 9, 200 + i] * (i + 1) for i in range(11)]
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, detokenize=False)
    outs, scales = {}, {}
    for eager in (True, False):
        llm = LLM(model=path, dtype="float32", kv_cache_dtype="fp8", calculate_kv_scales=True,
                  enforce_eager=eager, max_num_seqs=16, gpu_memory_utilization=0.3,
                  skip_tokenizer_init=True)
        runner = llm.llm_engine.runner
        outs[eager] = [o.outputs[0].token_ids for o in llm.generate(
            [{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)]
        scales[eager] = [(a.k_scale, a.v_scale) for a in _attentions(llm.llm_engine)]
        assert not runner.kv_scales_pending and bool(runner.graphs) != eager
        del llm, runner
    assert all(k != 1.0 and v != 1.0 for k, v in scales[False])
    assert scales[True] == scales[False]
    assert outs[True] == outs[False]


def test_gpu_runner_steps_eagerly_until_the_scales_are_fixed(monkeypatch, tiny_checkpoint):
    """The GPU runner (on CPU, a stand-in graph table) replays no graph while a layer waits
    for its scales, and captures once, right after the first prefill fixed them."""
    from tamis.engine import engine as engine_module
    from tamis.engine.gpu_runner import GPUModelRunner
    from tamis.engine.llm import LLM
    monkeypatch.setattr(engine_module, "make_runner", GPUModelRunner)
    llm = LLM(model=str(tiny_checkpoint("llama")), device="cpu", kv_cache_dtype="fp8",
              calculate_kv_scales=True, max_num_seqs=4, kv_cache_memory_bytes="4MiB")
    monkeypatch.undo()
    runner = llm.llm_engine.runner
    assert runner.kv_scales_pending
    captures = []

    def capture_graphs():   # what the real capture would see: every scale fixed
        captures.append([a.calculate_kv_scales for a in _attentions(llm.llm_engine)])

    runner.graph_sizes = [1, 2, 4]
    runner.graphs = dict.fromkeys(runner.graph_sizes)   # replaying one would fail
    monkeypatch.setattr(runner, "capture_graphs", capture_graphs)
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True, detokenize=False)
    # A one-token prompt first: its first step looks like a decode step.
    for prompt in random_prompts((1, 9)):
        out = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)[0]
        assert len(out.outputs[0].token_ids) == 4
    assert captures == [[False, False]] and not runner.kv_scales_pending


def test_soft_capped_layers_are_rotated_not_shifted(tiny_checkpoint):
    """Gemma 2 (soft-capped scores, sliding and global layers): measured scales and the
    rotation, no key shift; prompt logprobs stay near the fp32 cache's."""
    path = tiny_checkpoint("gemma2")
    prompt = random_prompts((40,), seed=4, vocab=256)[0]
    params = SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)
    logprobs = {}
    for kv_dtype in ("auto", "fp8"):
        engine = make_engine(path, kv_cache_dtype=kv_dtype, calculate_kv_scales=True)
        out = run_to_completion(engine, [prompt], params)[0]
        logprobs[kv_dtype] = torch.tensor([out.prompt_logprobs[i][t].logprob
                                           for i, t in enumerate(prompt) if i])
    layers = _attentions(engine)
    assert all(a.soft_cap is not None and a.key_shift is None and a.kv_rotation is not None
               and a.k_scale != 1.0 for a in layers)
    change = (logprobs["fp8"] - logprobs["auto"]).abs()
    assert 0 < change.mean() <= 0.06, change
