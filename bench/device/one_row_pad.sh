#!/usr/bin/env bash
# One device call (session 33): the one-row tiles on words (pad=P) or scales and zero
# points (spad=P) whose rows are padded past N, so that their row strides are no longer
# powers of two: the chunked tile reads 8 chunks of K whose rows then lie 1 MB (words)
# or 32 KB (scales) apart on 4096 x 4096. Call 5 timed the words' pad alone.
source bench/device/carried.sh && tamis_env
nvidia-smi --query-gpu=name --format=csv,noheader
c=block_n=32+num_warps=8+split_k=1+k_chunks=8
ab_one_row 80 --shapes 4096x4096 --rounds 3 --field $c $c+spad=16 $c+spad=64 $c+pad=16+spad=16 spad=16
ab_one_row 80 --shapes 4096x6144 --rounds 3 --field pad=16 spad=16 pad=16+spad=16 spad=64
ab_one_row 60 --shapes 4096x4224 --rounds 2 --field $c $c+spad=16
