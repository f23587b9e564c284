#!/usr/bin/env bash
# One device call: the chunked one-row tile with zero points by sums of x (each chunk's
# sums its column's; 8 instructions a word, not 12): GPU tests, then A/B against the
# defaults on the narrow and deep layers.
source bench/device/carried.sh && tamis_env
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 60 python3 -P -m pytest -q -o pythonpath= -m gpu tests/kernels/test_w4a16_mma.py \
    -k "chunks_of_k or fills_one_wave" 2>&1 | grep -v Warning | tail -3
c=block_n=32+num_warps=8+split_k=1+k_chunks=8
ab_one_row 50 --shapes 4096x6144 --rounds 3 --field zeros_by_x_sums words_in_shared+zeros_by_x_sums
ab_one_row 50 --shapes 4096x4096 --rounds 3 --field $c $c+zeros_by_x_sums $c+words_in_shared+zeros_by_x_sums
ab_one_row 50 --shapes 14336x4096 --rounds 2 --field $c
