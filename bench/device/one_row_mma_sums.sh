#!/usr/bin/env bash
# One device call: zero points by sums of x taken by an MMA on the x operand
# (MmaConfig.x_sums_by_mma) instead of a pass over x after the wait: GPU tests, then
# A/B against the defaults (narrow layers: the split and chunked tiles; deep and wide).
source bench/device/carried.sh && tamis_env
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 150 python3 -P -m pytest -q -x -o pythonpath= -m gpu tests/kernels/test_w4a16_mma.py \
    -k "x_sums_match or chunks_of_k" 2>&1 | grep -v Warning | tail -3
s=zeros_by_x_sums+x_sums_by_mma
split=block_n=128+num_warps=4+split_k=8+k_chunks=0
ab_one_row 80 --shapes 4096x4096 --rounds 3 --field $s zeros_by_x_sums
ab_one_row 80 --shapes 4096x6144 --rounds 3 --field $s $split $split+$s
ab_one_row 80 --shapes 14336x4096 4096x28672 --rounds 2 --field x_sums_by_mma $s
