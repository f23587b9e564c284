"""The attention backend interface and the factory that picks one per device.

A backend is stateless: every call gets the layer's KV cache and the step's
``AttentionMetadata`` (layout in ``metadata.py``).
"""
from __future__ import annotations

import logging
from abc import ABC, abstractmethod

import torch

from tamis.engine.attention.metadata import AttentionMetadata

logger = logging.getLogger(__name__)

BACKEND_NAMES = ("auto", "torch", "triton")


class AttentionBackend(ABC):
    name: str = "base"

    @abstractmethod
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                kv_cache: torch.Tensor | None, meta: AttentionMetadata, scale: float,
                sliding_window: int | None = None, soft_cap: float | None = None,
                k_scale: float = 1.0, v_scale: float = 1.0) -> torch.Tensor:
        """Paged causal attention for one layer over a flattened batch.

        q [T, Hq, D], k/v [T, Hkv, D] (Hq a multiple of Hkv); kv_cache
        [2, num_blocks, block_size, Hkv, D]. First stores k/v at ``meta.slot_mapping``
        (slot -1 = skip), then each sequence's queries attend to its cached prefix plus
        its new tokens, causally; with ``sliding_window`` W a query at position i sees
        keys at positions j with i - W < j <= i (transformers' convention). With
        ``soft_cap`` C the scaled scores s become ``C * tanh(s / C)`` before the softmax
        (Gemma 2's attention logit soft-capping). An FP8 cache stores ``k / k_scale`` and
        ``v / v_scale`` and reads them back multiplied (``tamis.kernels.kv_quant``); other
        cache dtypes ignore the scales.
        Returns [T, Hq, D] in q's dtype. ``kv_cache=None`` (no cache, e.g. a profiling
        pass) attends over the new tokens only and requires no cached prefix.
        """


def get_attention_backend(name: str, device: torch.device | str) -> AttentionBackend:
    """"torch" anywhere; "triton" / "auto" use the Triton backend on CUDA.

    On CPU both "auto" and "triton" give the torch backend (Triton kernels need a GPU;
    "triton" logs that it fell back). Unknown names raise ValueError.
    """
    if name not in BACKEND_NAMES:
        raise ValueError(f"unknown attention backend {name!r}; choose one of {BACKEND_NAMES}")
    from tamis.engine.attention.torch_backend import TorchAttentionBackend

    is_cuda = torch.device(device).type == "cuda"
    if name == "torch" or not is_cuda:
        if name == "triton":
            logger.warning("attention backend 'triton' needs CUDA; using 'torch' on %s", device)
        return TorchAttentionBackend()
    try:
        from tamis.engine.attention.triton_backend import TritonAttentionBackend
    except ImportError as exc:
        if name == "triton":
            raise
        logger.warning("Triton attention backend unavailable (%s); using 'torch'", exc)
        return TorchAttentionBackend()
    return TritonAttentionBackend()
