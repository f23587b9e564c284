#!/usr/bin/env bash
# One device call (session 33, scratch diagnostic, wrong results on purpose): the narrow
# layers' one-row defaults with each word's unpack down from 3 shifts to 1 (the two high
# nibble pairs read at bits 4-7 of each half: TAMIS_DIAG_ONE_SHIFT in w4a16_fragments,
# kept only in bench/results/session33_one_shift.patch), against the same defaults in
# another process. Both with max_registers=128 as well (the diagnostic's build drops to
# 84-108 registers and ptxas then sinks the loads; at the cap they stay 8+ MMAs ahead).
source bench/device/carried.sh && tamis_env
nvidia-smi --query-gpu=name --format=csv,noheader
for round in 1 2; do
  ab_one_row 60 --shapes 4096x4096 4096x6144 --rounds 2 --field max_registers=128
  TAMIS_DIAG_ONE_SHIFT=1 TRITON_CACHE_DIR=/tmp/tc_diag ab_one_row 60 --shapes 4096x4096 4096x6144 \
      --rounds 2 --field max_registers=128
done
