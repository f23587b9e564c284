#!/usr/bin/env bash
# One device call: the one-row tile with 16 chunks of K in two n8 blocks of x^T's columns
# (no split-K sum, 16 warps a multiprocessor: 16 columns on 8 warps, 2 programs each,
# or 32 columns on 16 warps), with zero points per word or by sums of x taken by an MMA:
# GPU tests, then A/B against the defaults.
source bench/device/carried.sh && tamis_env
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 100 python3 -P -m pytest -q -o pythonpath= -m gpu tests/kernels/test_w4a16_mma.py \
    -k "chunks_of_k" 2>&1 | grep -v Warning | tail -3
c16=block_n=16+num_warps=8+split_k=1+k_chunks=16
w16=block_n=32+num_warps=16+split_k=1+k_chunks=16
s=zeros_by_x_sums+x_sums_by_mma
ab_one_row 120 --shapes 4096x4096 --rounds 3 --field $c16 $c16+$s $w16 $w16+$s
ab_one_row 100 --shapes 14336x4096 4096x6144 --rounds 2 --field $c16 $c16+$s $w16+$s
