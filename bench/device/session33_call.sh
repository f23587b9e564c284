#!/usr/bin/env bash
# One device call of session 33. On an H200 (the card): main's defaults and the
# GEMM / decode table (one_row_check.sh), the first H200 figures since session 23. On any
# other card, with PROBE=1 set: whether the chunked one-row tile's time follows its
# programs a multiprocessor (4096 x N with N = 4224 / 6144 / 8448: 132 / 192 / 264
# programs of 32 columns on 132 multiprocessors, i.e. 1 / 1.45 / 2 a multiprocessor).
source bench/device/carried.sh && tamis_env
name=$(nvidia-smi --query-gpu=name --format=csv,noheader)
echo "$name"
case "$name" in
  *H200*) bash bench/device/one_row_check.sh ;;
  *) [ -n "$PROBE" ] || exit 3   # session 33 call 2 ran the probe; later calls only want an H200
     c=block_n=32+num_warps=8+split_k=1+k_chunks=8
     ab_one_row 150 --shapes 4096x4224 4096x6144 4096x8448 --rounds 3 --field $c ;;
esac
