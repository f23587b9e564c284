#!/usr/bin/env bash
# Session 35's one full call (device time was short): the card's name; on an H200 the
# issue's table first (session34_check.sh); then on any card the words_before_wait GPU
# cases and A/B (session35_call.sh's), and every speed row of issue 5 on main
# (session35_table.sh's GEMM table; decode of bf16 and AWQ only).
source bench/device/carried.sh && tamis_env
name=$(nvidia-smi --query-gpu=name --format=csv,noheader)
echo "$name"
timeout 100 python3 -P -m pytest -q -o pythonpath= -m gpu tests/kernels/test_w4a16_mma.py \
    -k "chunks_of_k or one_row_default" 2>&1 | grep -v Warning | tail -3
ab_one_row 110 --shapes 4096x4096 4096x6144 --rounds 3 --field words_before_wait
timeout 190 python3 -P bench/bench_quant.py gemm --ms 1 16 64 256 2048 --rotate 16 2>&1 \
    | grep -v Warning | tail -24
timeout 170 python3 -P bench/bench_quant_decode.py --methods bf16 awq --batch-sizes 1 64 \
    --output-len 128 --repeats 2 2>&1 | grep -v Warning | tail -10
