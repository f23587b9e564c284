#!/usr/bin/env bash
# One device call (session 33): on 4096 x 6144, the chunked tile of 16 columns on 4 warps
# (384 programs) with its grid padded to 396 (3 a multiprocessor; whole_wave now rounds
# up to a multiple of the multiprocessors), and the 32-column default padded to 264.
source bench/device/carried.sh && tamis_env
nvidia-smi --query-gpu=name --format=csv,noheader
c16=block_n=16+num_warps=4
ab_one_row 70 --shapes 4096x6144 --rounds 3 --field $c16 $c16+whole_wave whole_wave
