#!/usr/bin/env bash
# One device call (session 33): AWQ decode at batch 1 with the padded chunked tile as
# 4096 x 4096's one-row default (main) and without it (chunked_one_row_config patched
# to decline where it would pad: the split tile, as before), alternating.
source bench/device/carried.sh && tamis_env
args="--methods awq --batch-sizes 1 --output-len 128 --repeats 2"
unpadded="from tamis.kernels import w4a16_mma as w; f = w.chunked_one_row_config; \
w.chunked_one_row_config = lambda *a: (lambda c: None if c is not None and c.whole_wave else c)(f(*a))"
for run in 1 2; do
  echo "main"; timeout 70 python3 -P bench/bench_quant_decode.py $args 2>&1 | grep "| tamis"
  echo "unpadded"; timeout 70 python3 -P -c "$unpadded
import runpy, sys; sys.argv = ['bench_quant_decode.py'] + '$args'.split()
runpy.run_path('bench/bench_quant_decode.py', run_name='__main__')" 2>&1 | grep "| tamis"
done
