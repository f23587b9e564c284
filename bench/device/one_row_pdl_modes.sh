#!/usr/bin/env bash
# One device call (session 33): the chunked tile on 4096 x 4096 (128 programs, 4 idle
# multiprocessors) under each PDL trigger (early: the default at one row; late: after
# the main loop; exit), against 4096 x 4224 (132 programs); then the words' row pad of
# 16 words on the split and deep / wide defaults.
source bench/device/carried.sh && tamis_env
nvidia-smi --query-gpu=name --format=csv,noheader
c=block_n=32+num_warps=8+split_k=1+k_chunks=8
for mode in early late exit; do
  echo "pdl $mode"; ab_one_row 50 --pdl $mode --shapes 4096x4096 4096x4224 --rounds 2 --field $c
done
ab_one_row 90 --shapes 4096x4096 14336x4096 4096x28672 --rounds 2 --field pad=16 pad=48
