#!/usr/bin/env bash
# One device call (session 33): main with the padded chunked tile as 4096 x 4096's
# one-row default (MmaConfig.whole_wave): its GPU tests, A/B against the split tile it
# replaces, then the GEMM table (M = 1, 16, 64) and decode at batch 1 and 64.
source bench/device/carried.sh && tamis_env
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 90 python3 -P -m pytest -q -o pythonpath= -m gpu tests/kernels/test_w4a16_mma.py \
    -k "whole_wave or chunks_of_k or fills_one_wave or one_row" 2>&1 | grep -v Warning | tail -3
ab_one_row 50 --shapes 4096x4096 --rounds 3 \
    --field block_n=128+num_warps=4+split_k=16+k_chunks=0+whole_wave+last_split_reduces
timeout 150 python3 -P bench/bench_quant.py gemm --ms 1 16 64 --rotate 16 2>&1 | grep -v Warning | tail -14
timeout 200 python3 -P bench/bench_quant_decode.py --methods bf16 awq --batch-sizes 1 64 \
    --output-len 128 --repeats 2 2>&1 | grep -v Warning | tail -8
