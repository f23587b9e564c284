#!/usr/bin/env bash
# Session 35's short call (device time left after failed starts): on an H200 the M = 1
# row the target is stated on, first; on any card the words_before_wait GPU
# cases and its A/B on the narrow layers.
source bench/device/carried.sh && tamis_env
name=$(nvidia-smi --query-gpu=name --format=csv,noheader)
echo "$name"
case "$name" in *H200*)
    timeout 120 python3 -P bench/bench_quant.py gemm --ms 1 --rotate 16 2>&1 \
        | grep -v Warning | tail -8 ;;
esac
timeout 80 python3 -P -m pytest -q -o pythonpath= -m gpu tests/kernels/test_w4a16_mma.py \
    -k "chunks_of_k" 2>&1 | grep -v Warning | tail -3
ab_one_row 100 --shapes 4096x4096 4096x6144 --rounds 3 --field words_before_wait
