"""tamis.quant: quantized checkpoints (AWQ, GPTQ, FP8, compressed-tensors) and `tamis quantize`.

``get_quant_config(model_dir, hf_config, quantization)`` detects a checkpoint's method
(``quant/detect.py``) and returns its ``QuantizationConfig``; each method's
``get_linear_method(prefix)`` gives the layer's ``LinearMethodBase``
(``engine/layers/quant_method.py``). The quantizers behind ``tamis quantize`` live in
``quant/quantizer/``.
"""
from tamis.quant.detect import QUANTIZATION_METHODS, get_quant_config

__all__ = ["QUANTIZATION_METHODS", "get_quant_config"]
