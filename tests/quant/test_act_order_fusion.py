"""GPTQ act-order layers take their input already sorted from their producer
(``tamis.engine.models.act_order_fusion``): in the Llama decoder the norms and the
activation write ``y[..., wna16_perm]``, and qkv_proj, gate_up_proj and down_proj skip
their gather; o_proj and every layer outside the known pairs keep it. The logits do not
change by a bit.

The GPU kernels are the ones that gather, so on the CPU a stand-in kernel with the same
``apply`` (the sorted-input gather, then a launcher) runs a plain matmul over the sorted
rows; the CUDA test at the end runs the real kernels with CUDA graphs.
"""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from tamis.engine.attention.metadata import forward_context
from tamis.engine.layers.activation import GeluTanhAndMul, SiluAndMul
from tamis.engine.loader import load_model
from tamis.engine.models import act_order_fusion
from tamis.kernels.w4a16 import dequantize_wna16
from tamis.quant import wna16_kernels
from tamis.quant.wna16 import expect_permuted_input, gathered_input_perm
from test_quant_dummy_load import QUANT_CONFIGS, TINY_LLAMA

GPTQ_ACT_ORDER = QUANT_CONFIGS["gptq-act-order"]
TINY_GEMMA2 = dict(TINY_LLAMA, architectures=["Gemma2ForCausalLM"], model_type="gemma2",
                   hidden_activation="gelu_pytorch_tanh", sliding_window=16,
                   query_pre_attn_scalar=64, attn_logit_softcapping=50.0,
                   final_logit_softcapping=30.0, tie_word_embeddings=True)
FUSED = ("self_attn.qkv_proj", "mlp.gate_up_proj", "mlp.down_proj")


class SortedInputTorchKernel(wna16_kernels._TritonWordsKernel):
    """The GPU kernels' ``apply`` (gather unless the input comes sorted, then a
    launcher) over a plain float32 matmul of the sorted rows, so the CPU runs it."""

    @classmethod
    def can_implement(cls, spec):
        return True, None

    def __init__(self, spec):
        super().__init__(spec)
        self.launchers = {"torch": self._matmul}

    def route(self, m: int) -> str:
        return "torch"

    def _matmul(self, x2, qweight, scales, zeros, group_size):
        weight = dequantize_wna16(qweight, scales, zeros, group_size, self.spec.bits,
                                  self.spec.in_features)
        return (x2.float() @ weight).to(x2.dtype)


def _write_config(folder, arch_config) -> str:
    """A checkpoint folder of ``arch_config`` with GPTQ act-order, for dummy weights."""
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(
        dict(arch_config, quantization_config=GPTQ_ACT_ORDER)))
    return str(folder)


def _load(tmp_path, arch_config, fuse: bool, monkeypatch, kernel=SortedInputTorchKernel):
    folder = _write_config(tmp_path / ("fused" if fuse else "unfused"), arch_config)
    config = SimpleNamespace(model=folder, dtype="float32", load_format="dummy",
                             quantization=None, seed=0, attention_backend="torch")
    with monkeypatch.context() as patch:
        if not fuse:
            patch.setattr(act_order_fusion, "fuse_act_order_permutations", lambda model: 0)
        with wna16_kernels.only_kernels(kernel):
            model, _ = load_model(config, "cpu")
    return model


def _count_gathers(monkeypatch) -> dict[str, int]:
    """Per layer prefix, how many forward calls gathered their input."""
    counts: dict[str, int] = {}
    sorted_input = wna16_kernels._TritonWordsKernel.sorted_input

    def counting(layer, x):
        out = sorted_input(layer, x)
        if out is not x:
            counts[layer.prefix] = counts.get(layer.prefix, 0) + 1
        return out
    monkeypatch.setattr(wna16_kernels._TritonWordsKernel, "sorted_input",
                        staticmethod(counting))
    return counts


@torch.no_grad()
def _logits(model):
    ids = torch.tensor([3, 17, 101, 7, 250, 9, 42])
    with forward_context(None, []):
        return model.compute_logits(model(ids, torch.arange(ids.numel())))


def test_llama_fusion_removes_all_gathers_but_o_proj_and_keeps_logits(tmp_path, monkeypatch):
    torch.set_num_threads(1)
    unfused = _load(tmp_path, TINY_LLAMA, False, monkeypatch)
    fused = _load(tmp_path, TINY_LLAMA, True, monkeypatch)
    layers = TINY_LLAMA["num_hidden_layers"]
    for i, layer in enumerate(fused.model.layers):
        for name in FUSED:
            assert layer.get_submodule(name).wna16_input_permuted, (i, name)
        assert not layer.self_attn.o_proj.wna16_input_permuted
        assert layer.input_layernorm.output_cols is not None
        assert layer.mlp.act_fn.output_cols is not None
    assert fused.model.norm.output_cols is None   # feeds the unquantized head
    counts = _count_gathers(monkeypatch)
    want = _logits(unfused)
    assert sum(counts.values()) == 4 * layers   # unfused: every act-order linear gathers
    counts.clear()
    got = _logits(fused)
    assert set(counts) == {f"model.layers.{i}.self_attn.o_proj" for i in range(layers)}
    assert torch.equal(got, want)


def test_fusion_is_idempotent_and_skips_the_cpu_reference(tmp_path, monkeypatch):
    """A second pass finds nothing left; the CPU reference kernel reads x in the
    checkpoint's order, so there is no gather to remove."""
    fused = _load(tmp_path, TINY_LLAMA, True, monkeypatch)
    assert act_order_fusion.fuse_act_order_permutations(fused) == 0
    (tmp_path / "ref").mkdir()
    reference = _load(tmp_path / "ref", TINY_LLAMA, True, monkeypatch,
                      kernel=wna16_kernels.ReferenceKernel)
    layer = reference.model.layers[0]
    assert layer.input_layernorm.output_cols is None
    assert not layer.self_attn.qkv_proj.wna16_input_permuted


def test_gemma2_keeps_its_gathers_and_logits(tmp_path, monkeypatch):
    """Gemma 2's decoder layer (extra norms) is not the Llama one: nothing is fused."""
    torch.set_num_threads(1)
    unfused = _load(tmp_path, TINY_GEMMA2, False, monkeypatch)
    fused = _load(tmp_path, TINY_GEMMA2, True, monkeypatch)
    assert not any(getattr(m, "wna16_input_permuted", False) for m in fused.modules())
    assert all(getattr(m, "output_cols", None) is None for m in fused.modules())
    assert torch.equal(_logits(fused), _logits(unfused))


def test_pairs_that_are_not_exact_keep_the_gather(tmp_path, monkeypatch):
    model = _load(tmp_path, TINY_LLAMA, False, monkeypatch)
    mlp = model.model.layers[0].mlp
    # A producer that cannot write another column order.
    assert not act_order_fusion.fuse_pair(GeluTanhAndMul(), mlp.down_proj)
    # Tensor parallel: a row-parallel layer that all-gathers its input and picks rows.
    mlp.down_proj.input_rows = torch.arange(mlp.down_proj.input_size)
    assert not act_order_fusion.fuse_pair(SiluAndMul(), mlp.down_proj)
    assert gathered_input_perm(mlp.down_proj) is not None   # still gathers


def test_reference_kernel_takes_permuted_input():
    """A layer told its input comes sorted, then given the CPU reference (as after moving
    it to the CPU), computes the same product from the sorted input."""
    from tamis.quant.wna16 import finalize_wna16
    torch.manual_seed(0)
    layer = torch.nn.Module()
    layer.prefix, layer.params_dtype = "layer", torch.float32
    k, n, group = 64, 16, 16
    g_idx = torch.randperm(k) // group
    finalize_wna16(layer, torch.randint(0, 16, (k, n)), torch.rand(k // group, n) + 0.5,
                   torch.full((k // group, n), 8.0), group, 4, g_idx=g_idx)
    x = torch.randn(3, k)
    want = layer.wna16_kernel.apply(layer, x, None)
    expect_permuted_input(layer)
    got = layer.wna16_kernel.apply(layer, x[..., layer.wna16_perm], None)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-5)


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@needs_cuda
def test_cuda_kernels_fused_logits_equal_unfused(tmp_path, monkeypatch):
    """The real W4A16 kernels in bf16: the fused model's logits equal, bit for bit, those
    of the model that gathers before every act-order layer."""
    logits = {}
    # drawn once, before either load (loading seeds and draws dummy weights)
    ids = torch.randint(0, TINY_LLAMA["vocab_size"], (37,), generator=torch.Generator().manual_seed(3))
    for fuse in (False, True):
        config = SimpleNamespace(model=_write_config(tmp_path / str(fuse), TINY_LLAMA),
                                 dtype="bfloat16", load_format="dummy", quantization=None,
                                 seed=0, attention_backend="auto")
        with monkeypatch.context() as patch:
            if not fuse:
                patch.setattr(act_order_fusion, "fuse_act_order_permutations", lambda m: 0)
            model, _ = load_model(config, "cuda")
        assert model.model.layers[0].mlp.down_proj.wna16_input_permuted == fuse
        with torch.inference_mode(), forward_context(None, []):
            logits[fuse] = model.compute_logits(model(ids.cuda(), torch.arange(37, device="cuda")))
    assert torch.equal(logits[True], logits[False])


@pytest.mark.gpu
@needs_cuda
def test_cuda_graphs_fused_tokens_equal_unfused(tmp_path, monkeypatch):
    """Decode under CUDA graphs (batch 1 and a padded batch) gives the unfused greedy tokens."""
    from tamis.engine.llm import LLM
    from tamis.engine.sampling_params import SamplingParams
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True, detokenize=False)
    outs = {}
    for fuse in (False, True):
        with monkeypatch.context() as patch:
            if not fuse:
                patch.setattr(act_order_fusion, "fuse_act_order_permutations", lambda m: 0)
            llm = LLM(model=_write_config(tmp_path / str(fuse), TINY_LLAMA),
                      load_format="dummy", dtype="bfloat16", max_num_seqs=16,
                      gpu_memory_utilization=0.3, skip_tokenizer_init=True)
        runner = llm.llm_engine.runner
        assert runner.graphs, "decode runs under CUDA graphs"
        assert runner.model.model.layers[0].self_attn.qkv_proj.wna16_input_permuted == fuse
        outs[fuse] = [[o.outputs[0].token_ids for o in llm.generate(
            [{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)]
            for prompts in ([[1, 5, 9, 200]], [[1, 5, 9, 200 + i] * (i + 1) for i in range(11)])]
        del llm, runner
        torch.cuda.empty_cache()
    assert outs[True] == outs[False]
