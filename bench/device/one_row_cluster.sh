#!/usr/bin/env bash
# One device call: a column block's splits as one thread-block cluster summed through
# distributed shared memory (MmaConfig.cluster_sum), with zero points per word or by
# sums of x taken by an MMA: GPU tests, then A/B against the defaults.
source bench/device/carried.sh && tamis_env
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 60 python3 -P -m pytest -q -x -o pythonpath= -m gpu tests/kernels/test_w4a16_mma.py \
    -k "cluster" 2>&1 | grep -v Warning | tail -4
s=zeros_by_x_sums+x_sums_by_mma
ab_one_row 60 --shapes 4096x4096 --rounds 3 --field cluster_sum cluster_sum+$s cluster_sum+split_k=8
ab_one_row 60 --shapes 4096x6144 --rounds 3 --field cluster_sum block_n=128+num_warps=4+split_k=8+k_chunks=0+cluster_sum block_n=128+num_warps=4+split_k=8+k_chunks=0+cluster_sum+$s
ab_one_row 60 --shapes 14336x4096 4096x28672 --rounds 2 --field cluster_sum cluster_sum+x_sums_by_mma
