#!/usr/bin/env bash
# One device call of session 34, for the card: exits 3 at once unless the GPU is
# an H200. There: the GPU tests, the GEMM table (M = 1, 16, 64) and decode of main
# (session34_check.sh), then main's one-row default on the narrow layers (the chunked
# tile loading each chunk's 4 steps up front, MmaConfig.steps_up_front) against the
# paired loop it replaced.
name=$(nvidia-smi --query-gpu=name --format=csv,noheader)
echo "$name"
case "$name" in *H200*) ;; *) exit 3 ;; esac
bash bench/device/session34_check.sh
source bench/device/carried.sh && tamis_env
ab_one_row 80 --shapes 4096x4096 4096x6144 --rounds 3 --field steps_up_front=0+max_registers=0
