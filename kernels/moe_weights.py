"""The stacked expert weights the fused-MoE op takes: plain, integer (W4A16 / W8A16), FP8
(per channel or in 128x128 blocks) or INT8 W8A8.

Every form describes ``E`` experts' ``[N, K]`` projections (``y = x @ W_e.T``)::

    plain tensor   [E, N, K]                 the model dtype
    WNA16Experts   qweight  int32 [E, ceil(K/P), N]   P = 32 // bits codes per word, packed
                                                      along K: value j of word r is row P*r + j
                   scales   [E, G, N]        fp16 or fp32, G = ceil(K / group_size)
                   zeros    [E, G, N]        zero points as floats: w = (q - zero) * scale
                   g_idx    int32 [E, K] or None   act-order: row k uses group g_idx[e, k]
                                                   (else k // group_size)
    Fp8Experts     weight   float8_e4m3fn [E, N, K]
                   scale    float32 [E, N]   per output channel (a per-tensor scale repeated)
                   input_scale  float32 scalar or None: the static activation scale, else
                                activations are scaled per token
    Fp8BlockExperts  weight     float8_e4m3fn [E, N, K]
                     scale_inv  float32 [E, S * ceil(N_s/bn), ceil(K/bk)]: S shards of N_s
                                rows each (w13: gate then up, N_s = I; w2: one, N_s = H),
                                each shard's rows cut into blocks of its own, so a shard
                                that is not whole blocks ends in a partial block
                     activations are quantized per token and K group of bk (W8A8)
    Int8Experts    weight   int8 [E, N, K], symmetric
                   scale    float32 [E, N]   per output channel
                   activations are int8, one dynamic scale per token (always W8A8)

Per expert this is the dense layout of ``tamis.kernels.w4a16`` (integers),
``tamis.kernels.fp8`` (FP8), ``tamis.kernels.fp8_block`` (block FP8) and
``tamis.kernels.int8`` (INT8) with an expert dim in front. ``dense_expert`` dequantizes one
expert: the plain-torch reference reads weights through it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Union

import torch


@dataclass(frozen=True)
class WNA16Experts:
    qweight: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor
    group_size: int
    bits: int
    in_features: int
    g_idx: torch.Tensor | None = None

    @property
    def shape(self) -> tuple[int, int, int]:
        return self.qweight.shape[0], self.qweight.shape[2], self.in_features

    def group_of_rows(self, expert: int) -> torch.Tensor:
        """int64 [K]: the scale group of each input row of ``expert``."""
        if self.g_idx is not None:
            return self.g_idx[expert].long()
        return torch.arange(self.in_features, device=self.qweight.device) // self.group_size

    def dense(self, expert: int) -> torch.Tensor:
        """Expert ``expert``'s weight [N, K] in float32."""
        per_word = 32 // self.bits
        shifts = torch.arange(per_word, dtype=torch.int32, device=self.qweight.device) * self.bits
        words = self.qweight[expert]
        codes = (words.unsqueeze(1) >> shifts[None, :, None]) & ((1 << self.bits) - 1)
        codes = codes.reshape(-1, words.shape[1])[:self.in_features]
        group = self.group_of_rows(expert)
        weight = (codes.float() - self.zeros[expert][group].float()) * \
            self.scales[expert][group].float()
        return weight.t()


@dataclass(frozen=True)
class Fp8Experts:
    weight: torch.Tensor
    scale: torch.Tensor
    input_scale: torch.Tensor | None = None

    @property
    def shape(self) -> tuple[int, int, int]:
        return tuple(self.weight.shape)

    def dense(self, expert: int) -> torch.Tensor:
        """Expert ``expert``'s weight [N, K] in float32."""
        return self.weight[expert].float() * self.scale[expert].float()[:, None]


@dataclass(frozen=True)
class Fp8BlockExperts:
    weight: torch.Tensor
    scale_inv: torch.Tensor
    shard_rows: int
    block: tuple[int, int] = (128, 128)

    @property
    def shape(self) -> tuple[int, int, int]:
        return tuple(self.weight.shape)

    def scale_rows(self) -> torch.Tensor:
        """int64 [N]: the scale_inv row of each output row (its shard's block)."""
        rows = torch.arange(self.weight.shape[1], device=self.weight.device)
        blocks_per_shard = -(-self.shard_rows // self.block[0])
        return (rows // self.shard_rows) * blocks_per_shard + \
            (rows % self.shard_rows) // self.block[0]

    def dense(self, expert: int) -> torch.Tensor:
        """Expert ``expert``'s weight [N, K] in float32, each element times its block's scale."""
        k = self.weight.shape[2]
        scales = self.scale_inv[expert].float()[self.scale_rows()]
        return self.weight[expert].float() * scales.repeat_interleave(self.block[1], dim=1)[:, :k]


@dataclass(frozen=True)
class Int8Experts:
    weight: torch.Tensor
    scale: torch.Tensor

    @property
    def shape(self) -> tuple[int, int, int]:
        return tuple(self.weight.shape)

    def dense(self, expert: int) -> torch.Tensor:
        """Expert ``expert``'s weight [N, K] in float32."""
        return self.weight[expert].float() * self.scale[expert].float()[:, None]


ExpertWeights = Union[torch.Tensor, WNA16Experts, Fp8Experts, Fp8BlockExperts, Int8Experts]


def expert_shape(weights: ExpertWeights) -> tuple[int, int, int]:
    """(E, N, K) of any form."""
    return tuple(weights.shape)


def dense_expert(weights: ExpertWeights, expert: int, dtype: torch.dtype) -> torch.Tensor:
    """One expert's weight [N, K] in ``dtype`` (dequantized for the quantized forms)."""
    if isinstance(weights, torch.Tensor):
        return weights[expert].to(dtype)
    return weights.dense(expert).to(dtype)
