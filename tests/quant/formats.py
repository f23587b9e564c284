"""Builders of checkpoint tensors straight from the published format descriptions, with
plain Python loops (independent of tamis.quant.packing), and a layer-loading helper that
drives tamis's fused linear layers the way the model loader does."""
from __future__ import annotations

import torch

from tamis.engine.layers.linear import QKVLinear, ReplicatedLinear

AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]  # AutoAWQ gemm.py: nibble i holds column 8c + order[i]


def _to_int32(value: int) -> int:
    return value - (1 << 32) if value >= (1 << 31) else value


def pack_along_rows(values: torch.Tensor, bits: int) -> torch.Tensor:
    """[R, C] -> [ceil(R/P), C]: word r of column c holds rows P*r + j at bits j*bits."""
    per = 32 // bits
    rows, cols = values.shape
    out = torch.zeros(-(-rows // per), cols, dtype=torch.int32)
    for r in range(out.shape[0]):
        for c in range(cols):
            word = 0
            for j in range(per):
                if r * per + j < rows:
                    word |= int(values[r * per + j, c]) << (bits * j)
            out[r, c] = _to_int32(word)
    return out


def pack_along_cols(values: torch.Tensor, bits: int) -> torch.Tensor:
    return pack_along_rows(values.t().contiguous(), bits).t().contiguous()


def pack_awq(values: torch.Tensor) -> torch.Tensor:
    """[R, N] -> [R, N/8] in AutoAWQ's GEMM order."""
    rows, cols = values.shape
    out = torch.zeros(rows, cols // 8, dtype=torch.int32)
    for r in range(rows):
        for c in range(cols // 8):
            word = 0
            for i in range(8):
                word |= int(values[r, 8 * c + AWQ_ORDER[i]]) << (4 * i)
            out[r, c] = _to_int32(word)
    return out


def make_layer(quant_config, input_size: int, shards: list[int] | None = None,
               prefix: str = "model.layers.0.self_attn.qkv_proj", head_dim: int = 8):
    """A QKVLinear (q = shards[0], k = v = shards[1]) or, with one shard, a ReplicatedLinear."""
    if shards and len(shards) == 3:
        assert shards[1] == shards[2]
        return QKVLinear(input_size, head_dim, shards[0] // head_dim, shards[1] // head_dim,
                         quant_config=quant_config, prefix=prefix,
                         params_dtype=torch.float32)
    return ReplicatedLinear(input_size, shards[0] if shards else 32, quant_config=quant_config,
                            prefix=prefix, params_dtype=torch.float32)


def load_layer(layer, tensors: dict[tuple[str, object], torch.Tensor]) -> None:
    """tensors: {(param_name, shard_id or None): checkpoint tensor}; then finalize."""
    params = dict(layer.named_parameters())
    for (name, shard_id), tensor in tensors.items():
        if name not in params:
            raise ValueError(f"unexpected tensor {name!r}")
        param = params[name]
        if shard_id is None:
            param.weight_loader(param, tensor)
        else:
            param.weight_loader(param, tensor, shard_id)
    layer.process_weights_after_loading()


# ------------------------------------------------------------------ W8A8 checkpoints

FP8_MAX = 448.0
QUANTIZED_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def quantize_block_fp8(weight: torch.Tensor, block: int = 128):
    """[N, K] -> (float8 [N, K], weight_scale_inv float32 [ceil(N/b), ceil(K/b)]), one
    block at a time as DeepSeek's and transformers' quantizers do: scale_inv = amax / 448,
    edge blocks as large as what is left of the tensor."""
    n, k = weight.shape
    codes = torch.empty(n, k, dtype=torch.float8_e4m3fn)
    scale_inv = torch.empty(-(-n // block), -(-k // block), dtype=torch.float32)
    for i in range(scale_inv.shape[0]):
        for j in range(scale_inv.shape[1]):
            tile = weight[i * block:(i + 1) * block, j * block:(j + 1) * block].float()
            amax = tile.abs().max()
            scale = amax / FP8_MAX if amax > 0 else torch.tensor(1.0)
            scale_inv[i, j] = scale
            codes[i * block:(i + 1) * block, j * block:(j + 1) * block] = (
                (tile / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn))
    return codes, scale_inv


def quantize_int8_per_channel(weight: torch.Tensor):
    """[N, K] -> (int8 [N, K], weight_scale float32 [N, 1]), symmetric, amax -> 127."""
    amax = weight.float().abs().amax(dim=1, keepdim=True)
    scale = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))
    codes = torch.round(weight.float() / scale).clamp(-128, 127).to(torch.int8)
    return codes, scale


def write_quantized_checkpoint(source, out, quantize, quantization_config: dict):
    """Copies the HF folder ``source`` to ``out`` with every decoder linear replaced by
    ``quantize(weight) -> {suffix: tensor}`` ("weight", "weight_scale_inv", ...), and
    ``quantization_config`` in config.json. Embeddings, norms and lm_head stay as they are."""
    import json
    import shutil
    from pathlib import Path

    from safetensors.torch import load_file, save_file

    source, out = Path(source), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for file in source.glob("*.safetensors"):
        for name, tensor in load_file(str(file)).items():
            module, _, leaf = name.rpartition(".")
            if leaf == "weight" and module.rpartition(".")[2] in QUANTIZED_LINEARS:
                tensors.update({f"{module}.{suffix}": value
                                for suffix, value in quantize(tensor).items()})
            else:
                tensors[name] = tensor
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    for file in source.iterdir():
        if file.is_file() and not file.name.endswith(".safetensors") and file.name != "config.json":
            shutil.copy(file, out / file.name)
    config = json.loads((source / "config.json").read_text())
    config["quantization_config"] = quantization_config
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def tamis_greedy(model_dir, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """tamis's greedy continuations of ``prompts`` (EOS ignored) through its paged engine,
    fp32, all prompts batched."""
    from tamis import SamplingParams
    from tamis.engine.engine import LLMEngine

    engine = LLMEngine(model=str(model_dir), dtype="float32", kv_cache_memory_bytes="64MiB")
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, params)
    finished = {}
    while engine.has_unfinished_requests():
        finished.update({out.request_id: out for out in engine.step() if out.finished})
    return [list(finished[str(i)].outputs[0].token_ids) for i in range(len(prompts))]


def greedy_pair(model_dir, reference, prompts: list[list[int]], max_tokens: int = 8):
    """(tamis's, ``reference``'s) greedy continuations of ``prompts``, EOS ignored: tamis's
    from ``tamis_greedy``, the transformers ``reference`` one prompt at a time."""
    ours = tamis_greedy(model_dir, prompts, max_tokens)
    theirs = []
    for prompt in prompts:
        ids = torch.tensor([prompt])
        with torch.no_grad():
            out = reference.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                     max_new_tokens=max_tokens, min_new_tokens=max_tokens,
                                     pad_token_id=0)
        theirs.append(out[0, len(prompt):].tolist())
    assert all(len(tokens) == max_tokens for tokens in ours + theirs)
    return ours, theirs
