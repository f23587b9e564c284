"""The quantizers behind `tamis quantize`: round-to-nearest, GPTQ and AWQ for integer
weights, per-channel FP8 (round-to-nearest or GPTQ); ``pipeline.quantize_checkpoint`` runs
one over a model and ``writer`` saves the result in the published layouts that
``tamis.quant`` loads."""
