"""AWQ (Lin et al., 2023): activation-aware per-input-channel scales.

For linears sharing one input x, search ``s = mean|x|^a / mean|w~|^(1-a)`` (normalized,
``a`` on a grid of 20 points in [0, 1); w~ is |w| relative to its group's max, AutoAWQ's
"duo scaling") minimizing ``|| x W^T - (x / s) Q(W * s)^T ||^2`` over calibration rows;
then W <- W * s and the op producing x absorbs 1 / s (a norm's weight, or the rows of the
preceding linear). The pipeline then rounds the scaled weights on an asymmetric grid
(AWQ's zero-point format): by default with GPTQ's error feedback (static groups, so the
checkpoint stays a plain AWQ GEMM one; ``pipeline.QuantizeOptions.awq_gptq``), or to
nearest as AutoAWQ does (``--no-awq-gptq``).
"""
from __future__ import annotations

import torch

from tamis.quant.quantizer.grid import rtn_quantize

GRID_POINTS = 20


def _pseudo_quantize(weight: torch.Tensor, bits: int, group_size: int, sym: bool) -> torch.Tensor:
    # Full-range grids here (no clipping search: 20x cheaper); the weights are clipped
    # once, after the scales are chosen (pipeline), as AutoAWQ does.
    return rtn_quantize(weight, bits, group_size, sym=sym, search=False).dequantize()


def _weight_profile(weights: list[torch.Tensor], group_size: int) -> torch.Tensor:
    w = torch.cat(weights, dim=0).abs().float()
    n, k = w.shape
    group = k if group_size == -1 else group_size
    pad = -k % group  # zero columns: a partial last group (GPTQ's ceil(K / G) groups)
    grouped = torch.nn.functional.pad(w, (0, pad)).reshape(n, -1, group)
    relative = grouped / grouped.amax(dim=2, keepdim=True).clamp(min=1e-8)
    return relative.reshape(n, k + pad)[:, :k].mean(dim=0)


@torch.no_grad()
def search_scales(x: torch.Tensor, weights: list[torch.Tensor], bits: int,
                  group_size: int, sym: bool = False) -> torch.Tensor:
    """x [T, K] calibration inputs; weights: the [N_i, K] linears reading x. Returns s [K].
    ``sym``: the grid the weights will be rounded on (AWQ's own format is asymmetric;
    GPTQ checkpoints may be symmetric)."""
    x = x.float()
    x_mean = x.abs().mean(dim=0)
    w_mean = _weight_profile(weights, group_size)
    w_all = torch.cat(weights, dim=0).float()
    reference = x @ w_all.t()
    best, best_loss = torch.ones_like(x_mean), float("inf")
    for step in range(GRID_POINTS):
        ratio = step / GRID_POINTS
        s = (x_mean.pow(ratio) / w_mean.pow(1 - ratio).clamp(min=1e-4)).clamp(min=1e-4)
        s = s / (s.max() * s.min()).sqrt()
        quantized = _pseudo_quantize(w_all * s, bits, group_size, sym) / s
        loss = (x @ quantized.t() - reference).pow(2).mean().item()
        if loss < best_loss:
            best, best_loss = s, loss
    return best


# ---------------------------------------------------------------- one decoder layer

SEARCH_ROWS = 512  # calibration rows (evenly spaced) the scale-search loss is measured on


def subsample(x: torch.Tensor, rows: int = SEARCH_ROWS) -> torch.Tensor:
    if x.shape[0] <= rows:
        return x
    return x[_picks(x.shape[0], rows).to(x.device)]


def _picks(total: int, rows: int) -> torch.Tensor:
    # Computed on the CPU whatever the device: the same rows on every device.
    return torch.linspace(0, total - 1, rows).long()


class RowSample:
    """The rows ``subsample`` picks from the concatenation of every batch ``add``-ed
    (``total_rows`` in all), kept as the batches come: a layer's calibration inputs
    (tokens x K per linear) are never held whole."""

    def __init__(self, total_rows: int, rows: int = SEARCH_ROWS):
        self.total = total_rows
        self.picks = None if total_rows <= rows else _picks(total_rows, rows)
        self.offset = 0
        self.parts: list[torch.Tensor] = []

    def add(self, x: torch.Tensor) -> None:
        """x [T, K]: the next T rows of the concatenation."""
        if self.picks is None:
            self.parts.append(x)
        else:
            end = self.offset + x.shape[0]
            mine = self.picks[(self.picks >= self.offset) & (self.picks < end)] - self.offset
            self.parts.append(x[mine.to(x.device)])
        self.offset += x.shape[0]

    def rows(self) -> torch.Tensor:
        """[min(total_rows, rows), K]: ``subsample(torch.cat(batches))``."""
        assert self.offset == self.total, (self.offset, self.total)
        return torch.cat(self.parts)


def check_layer(layer, prefix: str) -> None:
    """Raises ValueError unless ``layer`` has the Llama-style linears ``search_and_fold``
    scales (each of which reads every token of the layer's input)."""
    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    needed = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    if attn is None or mlp is None or not all(
            hasattr(attn, n) or hasattr(mlp, n) for n in needed):
        raise ValueError(f"{prefix}: AWQ scale search supports Llama-style layers "
                         f"(self_attn.q/k/v/o_proj, mlp.gate/up/down_proj)")


@torch.no_grad()
def search_and_fold(layer, prefix: str, x: dict[str, torch.Tensor], bits: int,
                    group_size: int, sym: bool) -> dict[str, torch.Tensor]:
    """Searches the AWQ scales of a Llama-style ``layer`` on ``x`` (linear name -> its
    calibration inputs [T, K]) and folds them in: the layer computes the same function,
    its linears now read x / s. Returns linear name -> s (linears left unscaled absent)."""
    check_layer(layer, prefix)
    attn, mlp = layer.self_attn, layer.mlp
    x = {name: subsample(value) for name, value in x.items()}

    def search(name: str, linears) -> torch.Tensor:
        return search_scales(x[name], [m.weight for m in linears], bits, group_size, sym)

    scaled = {}
    qkv = [attn.q_proj, attn.k_proj, attn.v_proj]
    s = search("self_attn.q_proj", qkv)
    _fold_norm(layer.input_layernorm.weight, s, qkv)
    scaled.update(dict.fromkeys(("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), s))
    if attn.v_proj.out_features == attn.o_proj.in_features:  # no GQA: v rows feed o
        s = search("self_attn.o_proj", [attn.o_proj])
        _fold_linear(attn.v_proj, s, attn.o_proj)
        scaled["self_attn.o_proj"] = s
    gate_up = [mlp.gate_proj, mlp.up_proj]
    s = search("mlp.gate_proj", gate_up)
    _fold_norm(layer.post_attention_layernorm.weight, s, gate_up)
    scaled.update(dict.fromkeys(("mlp.gate_proj", "mlp.up_proj"), s))
    s = search("mlp.down_proj", [mlp.down_proj])
    _fold_linear(mlp.up_proj, s, mlp.down_proj)
    scaled["mlp.down_proj"] = s
    return scaled


def _fold_norm(norm_weight: torch.Tensor, s: torch.Tensor, linears) -> None:
    norm_weight.div_(s)
    for linear in linears:
        linear.weight.mul_(s[None, :])


def _fold_linear(previous, s: torch.Tensor, linear) -> None:
    previous.weight.div_(s[:, None])
    if previous.bias is not None:
        previous.bias.div_(s)
    linear.weight.mul_(s[None, :])
