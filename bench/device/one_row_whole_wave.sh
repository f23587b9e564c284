#!/usr/bin/env bash
# One device call (session 33): the chunked one-row tile with its grid padded to one
# program a multiprocessor (MmaConfig.whole_wave) on 4096 x 4096 (128 column blocks on
# 132 multiprocessors): GPU tests, then A/B against the split default and the unpadded
# chunked tile.
source bench/device/carried.sh && tamis_env
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 90 python3 -P -m pytest -q -o pythonpath= -m gpu tests/kernels/test_w4a16_mma.py \
    -k "whole_wave or chunks_of_k or fills_one_wave" 2>&1 | grep -v Warning | tail -3
c=block_n=32+num_warps=8+split_k=1+k_chunks=8
ab_one_row 80 --shapes 4096x4096 --rounds 4 --field $c $c+whole_wave
ab_one_row 40 --shapes 2048x4096 --rounds 2 --field $c $c+whole_wave
