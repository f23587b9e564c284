#!/usr/bin/env bash
# One device call for the target card: exits 3 at once (a few seconds of device
# time) unless the GPU is an H200, since a call for kind nvidia-h200 may land on an H100,
# whose ratios are not the H200's. On an H200: the defaults and the table
# (one_row_check.sh), then the L2 prefetch A/B (one_row_l2.sh).
name=$(nvidia-smi --query-gpu=name --format=csv,noheader)
echo "$name"
case "$name" in *H200*) ;; *) exit 3 ;; esac
bash bench/device/one_row_check.sh
bash bench/device/one_row_l2.sh
