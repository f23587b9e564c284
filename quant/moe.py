"""Quantized mixture-of-experts layers: which expert method a checkpoint's config gives.

A quantized MoE checkpoint quantizes each expert's projections as it quantizes a dense
linear layer, one set of tensors per expert (``experts.<e>.<proj>.qweight`` ...). The
experts get the method matching the linear method the config picks for their prefix
(``model.layers.<i>.<mlp>.experts``), so ignore lists and config groups apply as to any
layer; the router (``gate``) is an ordinary linear layer.

==========================================  ==========================================
linear method for the experts               expert method (stacked, kept quantized)
==========================================  ==========================================
unquantized (ignored / not targeted)        ``UnquantizedFusedMoEMethod``
AWQ (GEMM)                                  ``AWQMoEMethod``      (``quant/moe_wna16.py``)
GPTQ (v1 / v2, 4 / 8 bits, act-order)       ``GPTQMoEMethod``
compressed-tensors pack-quantized           ``CompressedTensorsWNA16MoEMethod``
FP8 per-tensor / per-channel (vLLM ``fp8``  ``Fp8MoEMethod``      (``quant/moe_fp8.py``)
and compressed-tensors float-quantized)
online FP8 (``quantization="fp8"``)         ``OnlineFp8MoEMethod``
block-wise FP8 (``weight_block_size``)      ``Fp8BlockMoEMethod`` (``quant/moe_fp8_block.py``)
compressed-tensors INT8 W8A8                ``Int8MoEMethod``     (``quant/moe_int8.py``)
(``int-quantized``)
==========================================  ==========================================

Anything else is refused at load, naming the layer.
"""
from __future__ import annotations

from tamis.engine.layers.quant_method import FusedMoEMethodBase, QuantizationConfig

SUPPORTED = ("AWQ, GPTQ, compressed-tensors W4A16/W8A16 (pack-quantized), FP8 with "
             "per-tensor or per-channel scales (serialized or online), block-wise FP8 and "
             "INT8 W8A8 (int-quantized)")


def get_moe_method(quant_config: QuantizationConfig, prefix: str) -> FusedMoEMethodBase:
    """The expert method for the MoE layer at ``prefix``; ValueError naming the layer
    and the method when its experts' format has no expert kernel."""
    from tamis.engine.layers.fused_moe import UnquantizedFusedMoEMethod
    from tamis.engine.layers.linear import UnquantizedLinearMethod
    from tamis.quant.awq import AWQLinearMethod
    from tamis.quant.compressed_tensors import CTWNA16LinearMethod
    from tamis.quant.fp8 import Fp8LinearMethod, OnlineFp8LinearMethod
    from tamis.quant.fp8_block import Fp8BlockLinearMethod
    from tamis.quant.gptq import GPTQLinearMethod
    from tamis.quant.int8 import Int8W8A8LinearMethod
    from tamis.quant.moe_fp8 import Fp8MoEMethod, OnlineFp8MoEMethod
    from tamis.quant.moe_fp8_block import Fp8BlockMoEMethod
    from tamis.quant.moe_int8 import Int8MoEMethod
    from tamis.quant.moe_wna16 import (AWQMoEMethod, CompressedTensorsWNA16MoEMethod,
                                       GPTQMoEMethod)

    linear = quant_config.get_linear_method(prefix)
    if isinstance(linear, UnquantizedLinearMethod):
        return UnquantizedFusedMoEMethod()
    if isinstance(linear, AWQLinearMethod):
        return AWQMoEMethod(linear.config)
    if isinstance(linear, GPTQLinearMethod):
        return GPTQMoEMethod(linear.config)
    if isinstance(linear, CTWNA16LinearMethod):
        return CompressedTensorsWNA16MoEMethod(linear.bits, linear.group_size, linear.sym,
                                               linear.act_order)
    if isinstance(linear, OnlineFp8LinearMethod):
        return OnlineFp8MoEMethod()
    if type(linear) is Fp8LinearMethod:
        return Fp8MoEMethod(static=linear.static)
    if type(linear) is Fp8BlockLinearMethod:
        return Fp8BlockMoEMethod(linear.block)
    if type(linear) is Int8W8A8LinearMethod:
        return Int8MoEMethod()
    raise ValueError(f"{prefix}: {quant_config.get_name()} experts quantized as "
                     f"{type(linear).__name__} have no mixture-of-experts kernel in tamis; "
                     f"tamis runs {SUPPORTED} experts")
