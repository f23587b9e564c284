#!/usr/bin/env bash
# Session 35: every speed row of issue 5 on main, on whatever card comes (its name first):
# the quantized kernels' GPU tests, the GEMM table at M = 1, 16, 64, 256, 2048 (W4A16
# and FP8 against bf16 F.linear, weights cycled from DRAM), decode at batch 1 and 64.
source bench/device/carried.sh && tamis_env
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 170 python3 -P -m pytest -q -o pythonpath= -m gpu tests/kernels/test_w4a16_mma.py \
    tests/kernels/test_fp8.py 2>&1 | grep -v Warning | tail -3
timeout 170 python3 -P bench/bench_quant.py gemm --ms 1 16 64 256 2048 --rotate 16 2>&1 \
    | grep -v Warning | tail -24
timeout 220 python3 -P bench/bench_quant_decode.py --methods bf16 awq fp8 --batch-sizes 1 64 \
    --output-len 128 --repeats 2 2>&1 | grep -v Warning | tail -10
