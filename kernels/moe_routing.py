"""Top-k routing of a mixture-of-experts layer: softmax over the experts' logits, the
``top_k`` largest probabilities, optionally renormalised to sum to one.

    router_logits  [T, E]       any float dtype
    weights        [T, top_k]   float32, largest first
    ids            [T, top_k]   int32, in [0, E)

The reference is torch's softmax and ``topk`` (four launches and the casts); the Triton
kernel does it in one, a block of tokens per program: a row's softmax in float32, then
``top_k`` rounds of arg-max (the lowest index among equal maxima) that each knock out
their pick. Ties between distinct experts' float32 probabilities may break differently
from ``torch.topk``, whose order among equals is unspecified.
"""
from __future__ import annotations

import torch

from tamis.kernels._triton import kernel, next_power_of_2, use_triton

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = tl = None


def _check(router_logits: torch.Tensor, top_k: int) -> None:
    if router_logits.dim() != 2 or not 0 < top_k <= router_logits.shape[1]:
        raise ValueError(f"routing needs logits [T, E] and 0 < top_k <= E, got "
                         f"{tuple(router_logits.shape)} and top_k={top_k}")


def select_experts_ref(router_logits: torch.Tensor, top_k: int,
                       renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax over all experts (float32), the ``top_k`` largest, divided by their sum when
    ``renormalize`` (which equals a softmax over the top-k logits: Mixtral's routing)."""
    _check(router_logits, top_k)
    probs = torch.softmax(router_logits.float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids.to(torch.int32)


if tl is not None:
    @kernel
    def _topk_softmax_kernel(logits_ptr, weights_ptr, ids_ptr, num_tokens, num_experts,
                             stride_t, TOP_K: tl.constexpr, K_COLS: tl.constexpr,
                             RENORMALIZE: tl.constexpr, E_COLS: tl.constexpr,
                             BLOCK_T: tl.constexpr):
        tokens = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
        experts = tl.arange(0, E_COLS)
        real = experts < num_experts
        rows = tl.minimum(tokens, num_tokens - 1)     # the tail's rows repeat the last one
        x = tl.load(logits_ptr + rows[:, None].to(tl.int64) * stride_t + experts[None, :],
                    mask=real[None, :], other=float("-inf")).to(tl.float32)
        p = tl.exp(x - tl.max(x, axis=1)[:, None])
        p = p / tl.sum(p, axis=1)[:, None]
        p = tl.where(real[None, :], p, -1.0)          # padding columns are never picked
        cols = tl.arange(0, K_COLS)
        picked = tl.zeros([BLOCK_T, K_COLS], dtype=tl.float32)
        picked_ids = tl.zeros([BLOCK_T, K_COLS], dtype=tl.int32)
        for j in tl.static_range(TOP_K):
            best = tl.max(p, axis=1)
            arg = tl.argmax(p, axis=1)
            picked = tl.where(cols[None, :] == j, best[:, None], picked)
            picked_ids = tl.where(cols[None, :] == j, arg[:, None].to(tl.int32), picked_ids)
            p = tl.where(experts[None, :] == arg[:, None], -2.0, p)
        if RENORMALIZE:
            picked = picked / tl.sum(picked, axis=1)[:, None]
        out = tokens[:, None] * TOP_K + cols[None, :]
        keep = (tokens < num_tokens)[:, None] & (cols < TOP_K)[None, :]
        tl.store(weights_ptr + out, picked, mask=keep)
        tl.store(ids_ptr + out, picked_ids, mask=keep)


def select_experts_triton(router_logits: torch.Tensor, top_k: int,
                          renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``select_experts_ref`` in one launch (see the module docstring)."""
    _check(router_logits, top_k)
    num_tokens, num_experts = router_logits.shape
    weights = torch.empty(num_tokens, top_k, dtype=torch.float32, device=router_logits.device)
    ids = torch.empty(num_tokens, top_k, dtype=torch.int32, device=router_logits.device)
    if num_tokens == 0:
        return weights, ids
    if router_logits.stride(1) != 1:
        router_logits = router_logits.contiguous()
    e_cols = next_power_of_2(num_experts)
    block_t = max(1, min(16, 512 // e_cols))    # 4 tokens a program at 128 experts
    _topk_softmax_kernel[(triton.cdiv(num_tokens, block_t),)](
        router_logits, weights, ids, num_tokens, num_experts, router_logits.stride(0),
        TOP_K=top_k, K_COLS=next_power_of_2(top_k), RENORMALIZE=renormalize,
        E_COLS=e_cols, BLOCK_T=block_t)
    return weights, ids


def select_experts(router_logits: torch.Tensor, top_k: int,
                   renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (weights float32 [T, top_k], expert ids int32 [T, top_k]): the Triton kernel
    on CUDA, the torch reference elsewhere."""
    if use_triton(router_logits):
        return select_experts_triton(router_logits, top_k, renormalize)
    return select_experts_ref(router_logits, top_k, renormalize)
