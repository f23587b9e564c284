#!/usr/bin/env bash
# Session 34, after MmaConfig.steps_up_front became the one-row default on the narrow
# layers: the chunked tiles' GPU tests (the new cases included), then the GEMM table
# (M = 1, 16, 64; weights cycled from DRAM) and decode at batch 1 and 64, bf16 and AWQ.
source bench/device/carried.sh && tamis_env
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 150 python3 -P -m pytest -q -o pythonpath= -m gpu tests/kernels/test_w4a16_mma.py \
    -k "chunks_of_k or whole_wave or one_row_default" 2>&1 | grep -v Warning | tail -4
timeout 150 python3 -P bench/bench_quant.py gemm --ms 1 16 64 --rotate 16 2>&1 | grep -v Warning | tail -14
timeout 200 python3 -P bench/bench_quant_decode.py --methods bf16 awq --batch-sizes 1 64 \
    --output-len 128 --repeats 2 2>&1 | grep -v Warning | tail -8
