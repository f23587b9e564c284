"""Online quantization while loading: a weight is high-precision only while it is loaded.

A method that quantizes a high-precision checkpoint at load (online FP8) registers each
weight it quantizes as a placeholder on the meta device (shape, dtype and loader
attributes, no storage) whose ``weight_loader`` is a ``StagedWeight``'s::

    first checkpoint tensor       a staging tensor of the weight's shape on the model's device
    each tensor                   copied in by the layer's own loader; its elements counted
    the weight's last element     quantize(staging) kept, the staging tensor freed
    process_weights_after_loading the method swaps the placeholder for ``take_quantized()``

Checkpoints keep a layer's tensors together, so the device holds the quantized model
plus the high-precision weights of the layers being loaded (about one layer), never the
whole model in high precision. The placeholder stays registered until
``process_weights_after_loading``, so the loader's name checks see the parameters a
high-precision checkpoint fills (and no ``weight_scale``).

Under ``load_format="dummy"`` the placeholder's ``dummy_init`` draws the weight as the
loader would draw a real one (normal, std ``DUMMY_STD``, from the generator it is given,
on that generator's device) and quantizes it the same way.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from tamis.engine.loader import DUMMY_STD
from tamis.quant.base import require

Quantize = Callable[[torch.Tensor], tuple[torch.Tensor, ...]]
Loader = Callable[..., None]


def placeholder(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A weight with a shape and a dtype but no storage (filled through a ``StagedWeight``)."""
    return torch.empty(shape, dtype=dtype, device="meta")


class StagedWeight:
    """The loading state of one placeholder weight.

    ``layer_loader(param, loaded, *shard_id)`` is the layer's own loader (it reads the
    placeholder's layout attributes: ``output_dim``, ``shard_dim``, ...); ``quantize``
    turns the complete high-precision weight into the tensors the method keeps. The
    staging tensor lives on the device the model is being built on (the default device
    when the ``StagedWeight`` is made).
    """

    def __init__(self, layer_loader: Loader, quantize: Quantize):
        self.layer_loader, self.quantize = layer_loader, quantize
        self.device = torch.get_default_device()
        self.staging: torch.Tensor | None = None
        self.loaded_elements = 0
        self.quantized: tuple[torch.Tensor, ...] | None = None

    def attrs(self) -> dict[str, Any]:
        """The placeholder's attributes: its ``weight_loader``, ``dummy_init`` and this state."""
        return {"weight_loader": self.load, "dummy_init": self.dummy_init, "staged": self}

    def load(self, param: nn.Parameter, loaded: torch.Tensor, *shard_id) -> None:
        """Copies ``loaded`` into the staging tensor through the layer's loader, and
        quantizes once as many elements as the weight has have been loaded. ValueError
        when a tensor arrives for a weight already quantized (a checkpoint tensor twice)."""
        if self.quantized is not None:
            raise ValueError(f"a tensor for the {tuple(param.shape)} weight arrived after "
                             f"all of it was loaded and quantized (is it in the checkpoint "
                             f"twice?)")
        if self.staging is None:
            self.staging = torch.empty(param.shape, dtype=param.dtype, device=self.device)
            self.staging.__dict__.update(vars(param))   # layout attributes the loader reads
        self.layer_loader(self.staging, loaded, *shard_id)
        self.loaded_elements += loaded.numel()
        if self.loaded_elements >= self.staging.numel():
            self._quantize_staging()

    def dummy_init(self, tensor: torch.Tensor, generator: torch.Generator) -> None:
        """Dummy weights: ``tensor`` (the placeholder) drawn whole on the generator's
        device, then quantized; the same values the loader draws for a real weight."""
        self.staging = torch.empty(tensor.shape, dtype=tensor.dtype, device=generator.device)
        self.staging.normal_(0.0, DUMMY_STD, generator=generator)
        self._quantize_staging()

    def take_quantized(self, layer: nn.Module) -> tuple[torch.Tensor, ...]:
        """The quantized tensors; ValueError naming ``layer`` when the weight was not
        loaded completely."""
        require(self.quantized is not None, layer,
                f"only {self.loaded_elements} elements of a weight were loaded; online "
                f"quantization needs all of its checkpoint tensors")
        return self.quantized

    def _quantize_staging(self) -> None:
        self.quantized = self.quantize(self.staging)
        self.staging = None
