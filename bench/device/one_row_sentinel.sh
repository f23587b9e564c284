#!/usr/bin/env bash
# One device call: the one-row split tiles with partials that are their own flags
# (MmaConfig.sentinel_partials: no counter, fence or barrier in the partner splits, one
# round of loads in the last), alone and with sums of x taken by an MMA: GPU tests,
# then A/B against the defaults.
source bench/device/carried.sh && tamis_env
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 60 python3 -P -m pytest -q -x -o pythonpath= -m gpu tests/kernels/test_w4a16_mma.py \
    -k "own_flags" 2>&1 | grep -v Warning | tail -4
s=zeros_by_x_sums+x_sums_by_mma
split=block_n=128+num_warps=4+split_k=8+k_chunks=0
ab_one_row 60 --shapes 4096x4096 --rounds 3 --field sentinel_partials sentinel_partials+$s sentinel_partials+max_registers=128
ab_one_row 60 --shapes 4096x6144 --rounds 3 --field $split $split+sentinel_partials $split+sentinel_partials+$s
ab_one_row 60 --shapes 14336x4096 4096x28672 --rounds 2 --field sentinel_partials sentinel_partials+x_sums_by_mma
