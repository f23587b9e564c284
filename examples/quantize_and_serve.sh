#!/usr/bin/env bash
# Quantize the embedded SmolLM2 (or MODEL) with GPTQ 4-bit, then serve it.
#   bash examples/quantize_and_serve.sh [MODEL] [METHOD]
# METHOD: gptq (default), awq or fp8. The checkpoint written is a standard GPTQ / AWQ GEMM /
# FP8 folder (config.json quantization_config), loadable by tamis, vLLM or transformers.
set -euo pipefail
MODEL="${1:-}"
METHOD="${2:-gptq}"
OUT="${OUT:-./smollm2-${METHOD}}"

case "$METHOD" in
  gptq) FLAGS=(--bits 4 --group-size 128 --desc-act) ;;
  awq)  FLAGS=(--group-size 64) ;;   # AWQ needs K % group == 0; SmolLM2's K is 576
  fp8)  FLAGS=() ;;
  *) echo "METHOD must be gptq, awq or fp8" >&2; exit 2 ;;
esac

tamis quantize ${MODEL:+"$MODEL"} --method "$METHOD" "${FLAGS[@]}" --output "$OUT"

# The quantization is read from $OUT/config.json; no --quantization flag is needed.
tamis generate --model "$OUT" --chat --max-tokens 40 "Write a haiku about rounding errors."
exec tamis serve "$OUT" --port "${PORT:-8000}"
