"""Our models' logits equal transformers' (fp32) through the paged KV cache.

Every arch is checked as (a) one prefill, (b) a prefill chunked across KV blocks and
(c) two sequences interleaved in mixed batches (prefill chunks beside single-token
decodes). Plus rope scaling types, sliding windows and the fused-layer weight loaders.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from paged_harness import PagedBatcher
from tamis.engine.attention.metadata import forward_context
from tamis.engine.layers.linear import MergedColumnLinear, QKVLinear
from tamis.engine.layers.quant_method import LinearMethodBase, set_weight_attrs
from tamis.engine.layers.rotary import get_rope
from tamis.engine.loader import kv_cache_spec, load_model

torch.set_num_threads(1)   # 2 threads stall on OpenMP barriers when the CPUs are shared
ATOL = 1e-4
TEXT = ("The quick brown fox jumps over the lazy dog. Paged attention stores keys and values "
        "in fixed-size blocks, so sequences of any length share one pool of memory. ")


def engine_config(model, **kw):
    fields = dict(model=str(model), dtype="float32", load_format="auto", quantization=None,
                  seed=0, attention_backend="torch")
    return SimpleNamespace(**{**fields, **kw})


def prompt_ids(path, length: int, offset: int = 0) -> list[int]:
    from transformers import AutoTokenizer
    ids = AutoTokenizer.from_pretrained(path)(TEXT * 8)["input_ids"]
    assert len(ids) >= offset + length
    return ids[offset:offset + length]


@torch.no_grad()
def reference_logits(path, *prompts: list[int]) -> list[torch.Tensor]:
    """transformers' logits for each prompt (its modeling code is the reference), with its
    eager attention: older versions ran Gemma 2 through SDPA, which skips its attention
    soft-capping (5.x refuses SDPA for Gemma 2 for that reason)."""
    from transformers import AutoModelForCausalLM
    ref = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                               attn_implementation="eager").eval()
    return [ref(torch.tensor([ids])).logits[0].float() for ids in prompts]


class Case:
    """One checkpoint loaded in our engine, with transformers' logits for two prompts."""

    def __init__(self, path, len_a: int = 50, len_b: int = 23, atol: float = ATOL):
        self.path, self.atol = path, atol
        self.model, self.hf_config = load_model(engine_config(path), "cpu")
        self.ids_a, self.ids_b = prompt_ids(path, len_a), prompt_ids(path, len_b, offset=7)
        self.ref_a, self.ref_b = reference_logits(path, self.ids_a, self.ids_b)

    def batcher(self, block_size: int = 4) -> PagedBatcher:
        return PagedBatcher(kv_cache_spec(self.hf_config), num_blocks=64, block_size=block_size)


@pytest.fixture(scope="module", params=["llama", "mistral", "qwen2", "qwen3", "smollm2"])
def case(request, tiny_checkpoint, smollm2_path):
    if request.param == "smollm2":
        # 30 layers, logits ~20: fp32 summation-order noise reaches ~1.5e-4 in chunked runs
        return Case(smollm2_path, len_a=32, len_b=14, atol=5e-4)
    return Case(tiny_checkpoint(request.param))


def test_single_prefill_matches_transformers(case):
    logits = case.batcher().run(case.model, [("a", case.ids_a)])["a"]
    assert logits.dtype == torch.float32
    torch.testing.assert_close(logits, case.ref_a, atol=case.atol, rtol=0)


def test_chunked_prefill_matches_transformers(case):
    batcher, got, start = case.batcher(block_size=4), [], 0
    for size in (5, 8, 3, 13, 1, 100):    # chunk edges fall inside and on block edges
        chunk = case.ids_a[start:start + size]
        if chunk:
            got.append(batcher.run(case.model, [("a", chunk)])["a"])
        start += size
    torch.testing.assert_close(torch.cat(got), case.ref_a, atol=case.atol, rtol=0)


def test_mixed_prefill_and_decode_batches_match_transformers(case):
    """a: prefill 20, then one token per step; b joins in chunks beside a's decodes."""
    batcher = case.batcher(block_size=4)
    got_a = [batcher.run(case.model, [("a", case.ids_a[:20])])["a"]]
    got_b, pos_a, pos_b = [], 20, 0
    b_chunks = [6, 9]                      # b's prefill chunks, then single tokens
    while pos_a < len(case.ids_a) or pos_b < len(case.ids_b):
        chunks = []
        if pos_b < len(case.ids_b):
            size = b_chunks.pop(0) if b_chunks else 1
            chunks.append(("b", case.ids_b[pos_b:pos_b + size]))
            pos_b += len(chunks[-1][1])
        if pos_a < len(case.ids_a):
            chunks.append(("a", case.ids_a[pos_a:pos_a + 1]))
            pos_a += 1
        out = batcher.run(case.model, chunks)
        got_a += [out["a"]] if "a" in out else []
        got_b += [out["b"]] if "b" in out else []
    torch.testing.assert_close(torch.cat(got_a), case.ref_a, atol=case.atol, rtol=0)
    torch.testing.assert_close(torch.cat(got_b), case.ref_b, atol=case.atol, rtol=0)


def test_plain_forward_without_metadata_matches(case):
    """attn_metadata=None (a profiling pass): one causal sequence, no cache."""
    ids = torch.tensor(case.ids_a)
    with torch.no_grad(), forward_context(None, []):
        logits = case.model.compute_logits(case.model(ids, torch.arange(len(ids))))
    torch.testing.assert_close(logits, case.ref_a, atol=case.atol, rtol=0)


def test_forward_keeps_no_cos_sin_table(case):
    """The step's cos/sin table dies with its forward: kept until the next one, it showed
    on the H200 as allocated memory that grew with the last step's token count."""
    ids = torch.tensor(case.ids_a)
    with torch.no_grad(), forward_context(None, []):
        case.model(ids, torch.arange(len(ids)))
    assert all(cache.empty for cache in case.model.model.rope_caches.values())


# ----------------------------------------------------------------- variants

ROPE_VARIANTS = {
    "linear": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 32,
               "rope_theta": 500000.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32,
             "rope_theta": 10000.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0},
}


@pytest.mark.parametrize("variant", sorted(ROPE_VARIANTS))
def test_rope_scaling_matches_transformers(tiny_checkpoint, variant):
    path = tiny_checkpoint("llama", rope_parameters=ROPE_VARIANTS[variant])
    case = Case(path, len_a=70, len_b=3)
    batcher, got = case.batcher(), []
    got.append(batcher.run(case.model, [("a", case.ids_a[:40])])["a"])
    for token in case.ids_a[40:]:
        got.append(batcher.run(case.model, [("a", [token])])["a"])
    torch.testing.assert_close(torch.cat(got), case.ref_a, atol=ATOL, rtol=0)


def test_old_style_rope_scaling_config_is_read():
    """transformers < 5 configs: rope_scaling (key "type") + rope_theta."""
    old = SimpleNamespace(rope_scaling={"type": "linear", "factor": 4.0}, rope_theta=1000.0,
                          max_position_embeddings=64)
    new = SimpleNamespace(rope_parameters={"rope_type": "linear", "factor": 4.0,
                                           "rope_theta": 1000.0}, max_position_embeddings=64)
    torch.testing.assert_close(get_rope(old, 16).inv_freq, get_rope(new, 16).inv_freq)
    plain = SimpleNamespace(rope_theta=1000.0, max_position_embeddings=64)
    torch.testing.assert_close(get_rope(old, 16).inv_freq * 4, get_rope(plain, 16).inv_freq)


def test_shared_cos_sin_cache_keeps_the_torch_and_fused_tables_apart():
    """The torch path's [T, 1, R] cos/sin and the fused kernel's [T, R/2] table share one
    cache per model: a lookup in one layout must not return the other's entry."""
    config = SimpleNamespace(rope_theta=1000.0, max_position_embeddings=64)
    rope = get_rope(config, 16)
    positions = torch.arange(5)
    q, k = torch.randn(5, 2, 16), torch.randn(5, 1, 16)
    q_ref, k_ref = rope(positions, q, k)            # fills the cache with the torch tables
    q_fused, k_fused = rope.forward_fused(positions, q.clone(), k.clone())
    torch.testing.assert_close(q_fused, q_ref)
    torch.testing.assert_close(k_fused, k_ref)
    q_again, _ = rope(positions, q, k)              # the fused table did not replace them
    torch.testing.assert_close(q_again, q_ref)


def test_unsupported_rope_type_names_it():
    config = SimpleNamespace(rope_parameters={"rope_type": "mrope", "rope_theta": 1e4},
                             max_position_embeddings=64)
    with pytest.raises(ValueError, match="mrope"):
        get_rope(config, 16)


def test_sliding_window_decode_matches_transformers(tiny_checkpoint):
    """Window 8 over a 40-token prompt: decodes and chunks far past the window."""
    case = Case(tiny_checkpoint("mistral", sliding_window=8), len_a=40, len_b=3)
    assert kv_cache_spec(case.hf_config).sliding_windows == (8, 8)
    batcher, got = case.batcher(block_size=4), []
    got.append(batcher.run(case.model, [("a", case.ids_a[:13])])["a"])
    got.append(batcher.run(case.model, [("a", case.ids_a[13:22])])["a"])
    for token in case.ids_a[22:]:
        got.append(batcher.run(case.model, [("a", [token])])["a"])
    torch.testing.assert_close(torch.cat(got), case.ref_a, atol=ATOL, rtol=0)


def test_llama_ignores_a_stray_sliding_window(tiny_checkpoint):
    """transformers' Llama has no sliding window even if the config carries the key."""
    case = Case(tiny_checkpoint("llama", sliding_window=8), len_a=30, len_b=3)
    assert kv_cache_spec(case.hf_config).sliding_windows == (None, None)
    logits = case.batcher().run(case.model, [("a", case.ids_a)])["a"]
    torch.testing.assert_close(logits, case.ref_a, atol=ATOL, rtol=0)


def test_qwen2_sliding_layers_follow_max_window_layers(tiny_checkpoint):
    path = tiny_checkpoint("qwen2", use_sliding_window=True, sliding_window=6, max_window_layers=1)
    case = Case(path, len_a=30, len_b=3)
    assert kv_cache_spec(case.hf_config).sliding_windows == (None, 6)
    logits = case.batcher().run(case.model, [("a", case.ids_a)])["a"]
    torch.testing.assert_close(logits, case.ref_a, atol=ATOL, rtol=0)


# ----------------------------------------------------------------- fused loaders

class PackedTestMethod(LinearMethodBase):
    """A fake quant method using every attribute of the contract: int32 ``qweight`` packing
    2 values along N, per-shard scalar ``weight_scale``, shard-independent ``g_idx``."""

    def create_weights(self, layer, input_size, output_partition_sizes, params_dtype):
        n = sum(output_partition_sizes)
        qweight = nn.Parameter(torch.zeros(input_size, n // 2, dtype=torch.int32),
                               requires_grad=False)
        set_weight_attrs(qweight, {"input_dim": 0, "output_dim": 1, "packed_dim": 1,
                                   "packed_factor": 2})
        scale = nn.Parameter(torch.zeros(len(output_partition_sizes)), requires_grad=False)
        set_weight_attrs(scale, {"is_per_shard_scalar": True})
        g_idx = nn.Parameter(torch.zeros(input_size, dtype=torch.int32), requires_grad=False)
        set_weight_attrs(g_idx, {"input_dim": 0, "ignore_shard": True})
        for name, param in (("qweight", qweight), ("weight_scale", scale), ("g_idx", g_idx)):
            layer.register_parameter(name, param)

    def apply(self, layer, x, bias=None):
        raise NotImplementedError


def test_fused_weight_loaders_place_every_shard():
    quant = SimpleNamespace(get_linear_method=lambda prefix: PackedTestMethod())
    qkv = QKVLinear(hidden_size=8, head_dim=4, num_heads=2, num_kv_heads=1, bias=True,
                    quant_config=quant, prefix="qkv")
    sizes = {"q": 8, "k": 4, "v": 4}
    for index, (shard, n) in enumerate(sizes.items()):
        qkv.qweight.weight_loader(qkv.qweight, torch.full((8, n // 2), index + 1, dtype=torch.int32), shard)
        qkv.weight_scale.weight_loader(qkv.weight_scale, torch.tensor(0.5 * (index + 1)), shard)
        qkv.g_idx.weight_loader(qkv.g_idx, torch.arange(8, dtype=torch.int32), shard)
        qkv.bias.weight_loader(qkv.bias, torch.full((n,), float(index)), shard)
    assert qkv.qweight[0].tolist() == [1, 1, 1, 1, 2, 2, 3, 3]
    assert qkv.weight_scale.tolist() == [0.5, 1.0, 1.5]
    assert qkv.g_idx.tolist() == list(range(8))
    assert qkv.bias.tolist() == [0.0] * 8 + [1.0] * 4 + [2.0] * 4
    with pytest.raises(ValueError, match="shape"):
        qkv.qweight.weight_loader(qkv.qweight, torch.zeros(8, 3, dtype=torch.int32), "k")
    with pytest.raises(ValueError, match="shard 'x'"):
        qkv.bias.weight_loader(qkv.bias, torch.zeros(4), "x")


def test_merged_column_loader_and_forward():
    gate_up = MergedColumnLinear(6, [5, 3], prefix="mlp.gate_up_proj")
    gate, up = torch.randn(5, 6), torch.randn(3, 6)
    gate_up.weight.weight_loader(gate_up.weight, gate, 0)
    gate_up.weight.weight_loader(gate_up.weight, up, 1)
    x = torch.randn(4, 6)
    torch.testing.assert_close(gate_up(x), torch.cat([x @ gate.T, x @ up.T], dim=-1))


# ----------------------------------------------------------------- GPU

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "qwen3"])
@pytest.mark.parametrize("backend", ["torch", "auto"])
def test_cuda_paged_runs_match_transformers(arch, backend, tmp_path):
    """fp32 on CUDA equals transformers; bf16 (dtype auto) picks the same tokens."""
    from transformers import AutoModelForCausalLM

    from tiny_models import make_tiny_checkpoint

    path = make_tiny_checkpoint(arch, tmp_path, with_tokenizer=False, sliding_window=8)
    ref = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).cuda().eval()
    ids = torch.randint(0, 49152, (40,), generator=torch.Generator().manual_seed(0)).tolist()
    with torch.no_grad():
        expected = ref(torch.tensor([ids], device="cuda")).logits[0].float()
    check_cuda_paged_run(path, backend, ids, expected, prefill=25)


def check_cuda_paged_run(path, backend: str, ids: list[int], expected: torch.Tensor,
                         prefill: int) -> None:
    """A prefill of ``prefill`` tokens, then one decode per token, on CUDA: fp32 logits
    within 2e-3 of ``expected``; bf16 (dtype auto) picks the same token at >= 90% of them."""
    for dtype, atol in (("float32", 2e-3), ("auto", None)):
        model, hf_config = load_model(engine_config(path, dtype=dtype, attention_backend=backend),
                                      "cuda")
        batcher = PagedBatcher(kv_cache_spec(hf_config), num_blocks=32, block_size=16,
                               dtype=model.dtype, device="cuda")
        got = [batcher.run(model, [("a", ids[:prefill])])["a"]]
        got += [batcher.run(model, [("a", [t])])["a"] for t in ids[prefill:]]
        got = torch.cat(got)
        if atol is not None:
            torch.testing.assert_close(got, expected, atol=atol, rtol=0)
        else:
            agree = (got.argmax(-1) == expected.argmax(-1)).sum().item()
            assert model.dtype == torch.bfloat16 and agree >= 0.9 * len(got)
