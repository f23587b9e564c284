#!/usr/bin/env bash
# One device call: the one-row W4A16 defaults with their split's bytes prefetched into L2
# before the PDL wait (MmaConfig.l2_prefetch: 1 a prefetch a 128-byte line, 2 a bulk
# prefetch a row): GPU tests, then A/B against the defaults on all four layers and on
# the chunked tile of 4096x4096.
source bench/device/carried.sh && tamis_env
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 60 python3 -P -m pytest -q -o pythonpath= -m gpu tests/kernels/test_w4a16_mma.py \
    -k "l2_prefetch" 2>&1 | grep -v Warning | tail -3
c=block_n=32+num_warps=8+split_k=1+k_chunks=8
ab_one_row 80 --shapes 4096x4096 4096x6144 --rounds 3 --field l2_prefetch=1 l2_prefetch=2
ab_one_row 50 --shapes 4096x4096 --rounds 2 --field $c+l2_prefetch=1 $c+l2_prefetch=2
ab_one_row 80 --shapes 14336x4096 4096x28672 --rounds 2 --field l2_prefetch=1 l2_prefetch=2
