#!/usr/bin/env bash
# Session 35's device call: on an H200 first the table the issue asks for
# (session34_check.sh); on any card, the chunked one-row tiles' GPU tests (with the new
# words_before_wait cases) and the A/B of MmaConfig.words_before_wait (steps 1-3's words
# and group parameters loaded before the PDL wait too) on the narrow layers.
name=$(nvidia-smi --query-gpu=name --format=csv,noheader)
echo "$name"
case "$name" in *H200*) bash bench/device/session34_check.sh ;; esac
source bench/device/carried.sh && tamis_env
timeout 150 python3 -P -m pytest -q -o pythonpath= -m gpu tests/kernels/test_w4a16_mma.py \
    -k "chunks_of_k" 2>&1 | grep -v Warning | tail -4
ab_one_row 150 --shapes 4096x4096 4096x6144 --rounds 4 --field words_before_wait
