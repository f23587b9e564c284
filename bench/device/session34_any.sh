#!/usr/bin/env bash
# Session 34's device call on whatever card comes. On an H200: session34_call.sh (the
# table the issue asks for). Elsewhere (an H100): does the chunked one-row tile gain from
# more bytes in flight when it has bandwidth to spare? With 33 or 66 programs (one a
# multiprocessor on a quarter or half of the H100's 132) each multiprocessor's share of
# DRAM bandwidth is 100 or 50 GB/s, above the 36 GB/s a multiprocessor of a full H200
# gets; so a gain here from a chunk's four steps in flight at once (two steps a load, a
# load ahead) says what a deeper pipeline could be worth on the H200, where the tile's
# time barely moved from the H100's (sessions 13 / 23 / 31).
name=$(nvidia-smi --query-gpu=name --format=csv,noheader)
case "$name" in *H200*) exec bash bench/device/session34_call.sh ;; esac
echo "$name"
source bench/device/carried.sh && tamis_env
c=block_n=32+num_warps=8+split_k=1+k_chunks=8
ab_one_row 150 --shapes 4096x1056 4096x2112 4096x4224 --rounds 3 --field $c \
    $c+paired_steps=0+load_steps=2 $c+paired_steps=0
