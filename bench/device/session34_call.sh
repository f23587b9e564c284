#!/usr/bin/env bash
# One device call of session 34, for the card: exits 3 at once unless the GPU is
# an H200. There: main's one-row defaults against their alternatives, the GEMM table
# (M = 1, 16, 64) and decode (one_row_check.sh); then whether the chunked tile gains from
# more bytes in flight on the H200, where (unlike the H100, near its bandwidth) a
# multiprocessor's loads in flight may bound it: the chunked tile with a chunk's four
# steps in flight at once (two steps a load, a load ahead), on the narrow layers.
name=$(nvidia-smi --query-gpu=name --format=csv,noheader)
echo "$name"
case "$name" in *H200*) ;; *) exit 3 ;; esac
bash bench/device/one_row_check.sh
source bench/device/carried.sh && tamis_env
c=block_n=32+num_warps=8+split_k=1+k_chunks=8
ab_one_row 80 --shapes 4096x4096 4096x6144 --rounds 2 --field $c $c+paired_steps=0+load_steps=2 \
    block_n=16+num_warps=4+split_k=1+k_chunks=8+paired_steps=0+load_steps=2
