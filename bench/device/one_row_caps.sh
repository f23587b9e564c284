#!/usr/bin/env bash
# One device call: the one-row defaults under ptxas register caps (more programs resident,
# so that the next launch's programs fit beside under PDL; some spill a few bytes), then on
# an H200 the main-tree check (bench/device/one_row_check.sh), on an H100 the M = 1 table.
source bench/device/carried.sh && tamis_env
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$gpu"
ab_one_row 80 --shapes 4096x4096 4096x6144 --rounds 3 --field max_registers=80 max_registers=96 \
    max_registers=104 max_registers=112
case "$gpu" in
    *H200*) bash bench/device/one_row_check.sh ;;
    *) timeout 90 python3 -P bench/bench_quant.py gemm --ms 1 --rotate 16 2>&1 | grep -v Warning | tail -6 ;;
esac
