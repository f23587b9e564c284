"""Linear layers whose storage is delegated to a linear method (see quant_method.py).

Every layer calls ``quant_method.create_weights`` to register its parameters, then
gives each parameter that has none its own ``weight_loader(param, loaded, shard_id)``.
The loaders are generic over parameter names: they read only the attributes listed in
``quant_method.py`` (``output_dim``, ``packed_dim``/``packed_factor``,
``is_per_shard_scalar``, ``ignore_shard``), so a quant method's ``qweight``,
``scales``, ``qzeros``, ``weight_scale`` ... load without this file knowing them.

Fused layers lay their shards out along N::

    QKVLinear.weight  [q_size + kv_size + kv_size, K]    shard_id "q" | "k" | "v"
    MergedColumnLinear.weight  [N0 + N1 + ..., K]          shard_id 0 | 1 | ...

Tensor parallelism (a model built under ``tensor_parallel(group)`` with N > 1 ranks):
``MergedColumnLinear`` and ``QKVLinear`` are column-parallel (each rank holds 1/N of every
fused shard, q/k/v by whole heads), ``RowLinear`` is row-parallel (1/N of K, outputs summed
over ranks, the bias added once). Their parameters' loaders first cut the rank's slice
out of the checkpoint tensor (``tamis.engine.distributed.sharding``), then load it as the
one-rank layer would; so quant methods see a smaller layer and need no parallel code.
With one rank none of this runs.
"""
from __future__ import annotations

import functools

import torch
from torch import nn

from tamis.engine.distributed.parallel_state import TPGroup, current_tp_group
from tamis.engine.distributed.row_shards import RowShardLoader
from tamis.engine.distributed.sharding import (Span, kv_head_span, materialize, shape_tensor,
                                               split_evenly, take_span)
from tamis.engine.layers.quant_method import (LinearMethodBase, QuantizationConfig,
                                              set_weight_attrs)


class UnquantizedLinearMethod(LinearMethodBase):
    """A plain ``weight [N, K]`` in the model dtype."""

    def create_weights(self, layer: nn.Module, input_size: int,
                       output_partition_sizes: list[int], params_dtype: torch.dtype) -> None:
        weight = nn.Parameter(torch.empty(sum(output_partition_sizes), input_size,
                                          dtype=params_dtype), requires_grad=False)
        set_weight_attrs(weight, {"input_dim": 1, "output_dim": 0})
        layer.register_parameter("weight", weight)

    def apply(self, layer: nn.Module, x: torch.Tensor,
              bias: torch.Tensor | None = None) -> torch.Tensor:
        from tamis.kernels.gemv import linear  # lazy, as in the other layers: no Triton at import
        return linear(x, layer.weight, bias)   # F.linear; a split-K GEMV for one CUDA row


def get_linear_method(quant_config: QuantizationConfig | None, prefix: str) -> LinearMethodBase:
    """The quant config's method for the layer at ``prefix``, or the unquantized one."""
    if quant_config is None:
        return UnquantizedLinearMethod()
    return quant_config.get_linear_method(prefix)


class LinearBase(nn.Module):
    """A linear layer ``[..., K] -> [..., N]`` with ``N = sum(output_partition_sizes)``."""

    def __init__(self, input_size: int, output_partition_sizes: list[int], bias: bool = False,
                 quant_config: QuantizationConfig | None = None, prefix: str = "",
                 params_dtype: torch.dtype | None = None):
        super().__init__()
        self.input_size = input_size
        self.output_partition_sizes = list(output_partition_sizes)
        self.output_size = sum(self.output_partition_sizes)
        self.prefix = prefix
        self.params_dtype = params_dtype or torch.get_default_dtype()
        self.quant_method = get_linear_method(quant_config, prefix)
        self.quant_method.create_weights(self, input_size, self.output_partition_sizes,
                                         self.params_dtype)
        if bias:
            self.bias = nn.Parameter(torch.empty(self.output_size, dtype=self.params_dtype),
                                     requires_grad=False)
            set_weight_attrs(self.bias, {"output_dim": 0})
        else:
            self.register_parameter("bias", None)
        for param in self.parameters(recurse=False):
            if not hasattr(param, "weight_loader"):
                set_weight_attrs(param, {"weight_loader": self.weight_loader})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.quant_method.apply(self, x, self.bias)

    def process_weights_after_loading(self) -> None:
        self.quant_method.process_weights_after_loading(self)

    def shard_index(self, shard_id) -> int:
        raise ValueError(f"{type(self).__name__} at {self.prefix!r} has no shard {shard_id!r}")

    def weight_loader(self, param: torch.Tensor, loaded: torch.Tensor, shard_id=None) -> None:
        """Copies a checkpoint tensor (one whole tensor, or shard ``shard_id``) into ``param``."""
        if shard_id is None:
            _copy_checked(param.data, loaded, self.prefix)
            return
        index = self.shard_index(shard_id)
        if getattr(param, "is_per_shard_scalar", False):
            _copy_checked(param.data[index:index + 1], loaded.reshape(1), self.prefix)
            return
        output_dim = getattr(param, "output_dim", None)
        if getattr(param, "ignore_shard", False) or output_dim is None:
            _copy_checked(param.data, loaded, self.prefix)
            return
        offset = sum(self.output_partition_sizes[:index])
        size = self.output_partition_sizes[index]
        if getattr(param, "packed_dim", None) == output_dim:
            factor = param.packed_factor
            offset, size = offset // factor, size // factor
        _copy_checked(param.data.narrow(output_dim, offset, size), loaded, self.prefix)


def _copy_checked(target: torch.Tensor, loaded: torch.Tensor, prefix: str) -> None:
    if target.shape != loaded.shape:
        raise ValueError(f"{prefix}: checkpoint tensor has shape {tuple(loaded.shape)}, "
                         f"the layer expects {tuple(target.shape)}")
    target.copy_(loaded)


class ReplicatedLinear(LinearBase):
    """One unfused linear layer, whole on every rank."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False,
                 quant_config: QuantizationConfig | None = None, prefix: str = "",
                 params_dtype: torch.dtype | None = None):
        super().__init__(input_size, [output_size], bias, quant_config, prefix, params_dtype)


# The attributes that tell a rank which part of a parameter it keeps (quant_method.py).
_SPLIT_LAYOUTS = ("input_dim", "output_dim", "is_per_shard_scalar", "holds_shape", "group_index")


def _wrap_loaders(layer: LinearBase, slicer) -> None:
    """Puts ``slicer(inner, param, loaded, shard_id)`` in front of every parameter's loader.
    A parameter with a loader of its own and no layout attribute cannot be split (block-wise
    FP8 scales): refused, naming the layer."""
    for name, param in layer.named_parameters(recurse=False):
        if not any(hasattr(param, attr) for attr in _SPLIT_LAYOUTS):
            raise ValueError(f"{layer.prefix}: {type(layer.quant_method).__name__} stores "
                             f"{name} in a layout tensor parallelism cannot split; run this "
                             f"checkpoint with --tensor-parallel-size 1")
        param.weight_loader = functools.partial(slicer, param.weight_loader)
        param.reads_checkpoint_slices = True


class RowLinear(LinearBase):
    """The row-parallel layer of a block (o_proj, down_proj): rank r holds input columns
    ``r*K/N .. (r+1)*K/N``, and the ranks' partial outputs are summed (bias added once).

    Group-wise quantized weights must split into whole groups per rank; a layer whose
    K/N is not a multiple of its group size is refused, naming the layer. Act-order
    (GPTQ ``desc_act``) layers keep their own groups' rows and gather their input
    (``tamis.engine.distributed.row_shards``)."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False,
                 quant_config: QuantizationConfig | None = None, prefix: str = "",
                 params_dtype: torch.dtype | None = None):
        self.tp = tp = current_tp_group()
        span = split_evenly(input_size, tp.rank, tp.size, f"{prefix}: input size")
        self.full_input_size = input_size
        try:
            super().__init__(span.size, [output_size], bias, quant_config, prefix, params_dtype)
        except ValueError as exc:
            if not tp.is_parallel:
                raise
            raise ValueError(f"{exc} (the input size {input_size} split over tensor parallel "
                             f"size {tp.size} ranks)") from None
        # Act-order layers under tensor parallelism: the input rows this rank keeps.
        self.register_buffer("input_rows", None, persistent=False)
        if tp.is_parallel:
            self._check_whole_groups()
            self._row_loader = RowShardLoader(self)
            _wrap_loaders(self, self._load_rank_slice)

    def _check_whole_groups(self) -> None:
        for name, param in self.named_parameters(recurse=False):
            size = getattr(param, "group_size", None)
            if size and getattr(param, "group_dim", None) == getattr(param, "input_dim", -1) \
                    and size < self.full_input_size and self.input_size % size:
                raise ValueError(
                    f"{self.prefix}: tensor parallel size {self.tp.size} splits the input size "
                    f"{self.full_input_size} into slices of {self.input_size}, which are not "
                    f"whole quantization groups of {size} ({name}); choose a tensor parallel "
                    f"size that divides the layer into whole groups")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.tp.is_parallel:
            return self.quant_method.apply(self, x, self.bias)
        if self.input_rows is not None:
            x = self.tp.all_gather(x, dim=-1).index_select(-1, self.input_rows)
        partial = self.quant_method.apply(self, x, self.bias if self.tp.rank == 0 else None)
        return self.tp.all_reduce(partial)

    def _load_rank_slice(self, inner, param: torch.Tensor, loaded, shard_id=None) -> None:
        self._row_loader.load(inner, param, loaded, shard_id)


class _ColumnParallel(LinearBase):
    """A column-parallel layer: ``shard_spans[i]`` is the rank's part of fused shard i."""

    shard_spans: list[Span]

    def _init_parallel(self, tp: TPGroup) -> None:
        self.tp = tp
        if tp.is_parallel:
            _wrap_loaders(self, self._load_rank_slice)

    def _load_rank_slice(self, inner, param: torch.Tensor, loaded, shard_id=None) -> None:
        dim = getattr(param, "output_dim", None)
        if shard_id is None and len(self.shard_spans) > 1 and dim is not None \
                and not getattr(param, "is_per_shard_scalar", False):
            # The checkpoint stores the fused layer whole (Phi-3): load it shard by shard.
            factor = param.packed_factor if getattr(param, "packed_dim", None) == dim else 1
            offset = 0
            for index, span in enumerate(self.shard_spans):
                piece = loaded.narrow(dim, offset // factor, span.full // factor)
                self._load_rank_slice(inner, param, piece, index)
                offset += span.full
            return
        span = self.shard_spans[0 if shard_id is None else self.shard_index(shard_id)]
        if getattr(param, "holds_shape", False):
            loaded = shape_tensor(loaded, (span.full, self.input_size),
                                  (span.size, self.input_size))
        elif dim is not None and not getattr(param, "is_per_shard_scalar", False):
            if getattr(param, "packed_dim", None) == dim:
                span = span.scaled_down(param.packed_factor)
            loaded = take_span(loaded, dim, span)
        inner(param, materialize(loaded), *(() if shard_id is None else (shard_id,)))


class MergedColumnLinear(_ColumnParallel):
    """Several linears over the same input fused along N (gate_up_proj); shard ids 0, 1, ...
    Column-parallel: each rank holds 1/N of every shard."""

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool = False,
                 quant_config: QuantizationConfig | None = None, prefix: str = "",
                 params_dtype: torch.dtype | None = None):
        tp = current_tp_group()
        self.shard_spans = [split_evenly(size, tp.rank, tp.size, f"{prefix}: output size")
                            for size in output_sizes]
        super().__init__(input_size, [span.size for span in self.shard_spans], bias,
                         quant_config, prefix, params_dtype)
        self._init_parallel(tp)

    def shard_index(self, shard_id) -> int:
        if not isinstance(shard_id, int) or not 0 <= shard_id < len(self.output_partition_sizes):
            return super().shard_index(shard_id)
        return shard_id


class QKVLinear(_ColumnParallel):
    """q, k and v projections fused along N; shard ids "q", "k", "v" (or 0, 1, 2).

    Column-parallel by whole heads: ``num_heads`` / ``num_kv_heads`` are this rank's
    (``num_attention_heads / N``; key/value heads per ``kv_head_span``)."""

    _SHARDS = {"q": 0, "k": 1, "v": 2, 0: 0, 1: 1, 2: 2}

    def __init__(self, hidden_size: int, head_dim: int, num_heads: int, num_kv_heads: int,
                 bias: bool = False, quant_config: QuantizationConfig | None = None,
                 prefix: str = "", params_dtype: torch.dtype | None = None):
        tp = current_tp_group()
        heads = split_evenly(num_heads, tp.rank, tp.size, "num_attention_heads")
        kv_heads = kv_head_span(num_kv_heads, tp.rank, tp.size)
        self.num_heads, self.num_kv_heads = heads.size, kv_heads.size
        self.q_size = heads.size * head_dim
        self.kv_size = kv_heads.size * head_dim
        kv = Span(num_kv_heads * head_dim, kv_heads.start * head_dim, self.kv_size)
        self.shard_spans = [Span(num_heads * head_dim, heads.start * head_dim, self.q_size), kv, kv]
        super().__init__(hidden_size, [self.q_size, self.kv_size, self.kv_size], bias,
                         quant_config, prefix, params_dtype)
        self._init_parallel(tp)

    def shard_index(self, shard_id) -> int:
        if isinstance(shard_id, bool) or shard_id not in self._SHARDS:
            return super().shard_index(shard_id)
        return self._SHARDS[shard_id]
