#!/usr/bin/env bash
# Session 35's call for words_before_wait (it got no machine): on an H200 the M = 1 row the
# issue's target is stated on; on any card the A/B of words_before_wait (each output
# checked against the fp32 product before it is timed).
source bench/device/carried.sh && tamis_env
name=$(nvidia-smi --query-gpu=name --format=csv,noheader)
echo "$name"
case "$name" in *H200*)
    timeout 100 python3 -P bench/bench_quant.py gemm --ms 1 --rotate 16 2>&1 \
        | grep -v Warning | tail -8 ;;
esac
ab_one_row 90 --shapes 4096x4096 4096x6144 --rounds 2 --field words_before_wait
