#!/usr/bin/env bash
# One device call: the one-row W4A16 defaults against their alternatives on the narrow
# layers (4096x6144: the chunked tile against the split tile; 4096x4096 the reverse),
# then the GEMM table (M = 1, 16, 64) and decode at batch 1 and 64, bf16 and AWQ.
source bench/device/carried.sh && tamis_env
nvidia-smi --query-gpu=name --format=csv,noheader
ab_one_row 70 --shapes 4096x6144 --rounds 3 --field block_n=128+num_warps=4+split_k=8+k_chunks=0
ab_one_row 70 --shapes 4096x4096 --rounds 3 --field block_n=32+num_warps=8+split_k=1+k_chunks=8
timeout 150 python3 -P bench/bench_quant.py gemm --ms 1 16 64 --rotate 16 2>&1 | grep -v Warning | tail -14
timeout 200 python3 -P bench/bench_quant_decode.py --methods bf16 awq --batch-sizes 1 64 \
    --output-len 128 --repeats 2 2>&1 | grep -v Warning | tail -8
