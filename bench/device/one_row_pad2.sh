#!/usr/bin/env bash
# One device call (session 33): (1) the chunked tile on 4096 x 4096 (128 programs)
# against 4096 x 4224 (132) with PDL on and off: does its 0.8 us gap come from the next
# kernel's programs, launched early, doubling up on the 4 idle multiprocessors? (2) the
# words' row pad on 4096 x 6144 at odd and even multiples of 16 words (calls 5-6: 16
# words gave 0.2-0.3 us, 32 / 64 / 128 nothing).
source bench/device/carried.sh && tamis_env
nvidia-smi --query-gpu=name --format=csv,noheader
c=block_n=32+num_warps=8+split_k=1+k_chunks=8
ab_one_row 60 --shapes 4096x4096 4096x4224 --rounds 2 --field $c
TAMIS_DISABLE_PDL=1 ab_one_row 60 --shapes 4096x4096 4096x4224 --rounds 2 --field $c
ab_one_row 90 --shapes 4096x6144 --rounds 3 --field pad=16 pad=48 pad=80 pad=144 pad=32
