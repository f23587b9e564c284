#!/usr/bin/env bash
# One device call: the GPU tests of the chunked one-row W4A16 tile, then A/Bs of the
# one-row variants (bench/ab_w4a16_one_row.py) on the narrow Llama-3.1-8B layers, then
# the wide and deep ones. Each step under its own time limit so one slow build cannot
# take the call. Run from the repository root on the device machine.
source bench/device/carried.sh && tamis_env
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 90 python3 -P -m pytest -q -o pythonpath= -m gpu tests/kernels/test_w4a16_mma.py \
    -k chunks_of_k 2>&1 | tail -5
ab_one_row 150 --shapes 4096x4096 4096x6144 --rounds 3 --field \
    words_in_shared+max_registers=80 \
    block_n=32+num_warps=8+split_k=1+k_chunks=8 block_n=16+num_warps=4+split_k=1+k_chunks=8 \
    block_n=8+num_warps=2+split_k=1+k_chunks=8 block_n=8+num_warps=4+split_k=1+k_chunks=8 \
    block_n=32+num_warps=8+split_k=1+k_chunks=8+words_in_shared=1 \
    block_n=16+num_warps=4+split_k=1+k_chunks=8+words_in_shared=1
ab_one_row 120 --shapes 4096x4096 4096x6144 --rounds 3 --field \
    block_n=16+num_warps=2+split_k=1+k_chunks=4 block_n=16+num_warps=4+split_k=1+k_chunks=4 \
    block_n=8+num_warps=2+split_k=1+k_chunks=8+words_in_shared=1 \
    block_n=64+num_warps=4+split_k=1+k_chunks=2 \
    words_in_shared+zeros_by_x_sums+max_registers=128
ab_one_row 100 --shapes 4096x28672 14336x4096 --rounds 2 --field \
    block_n=32+num_warps=8+split_k=1+k_chunks=8+zeros_by_x_sums=0 \
    block_n=32+num_warps=8+split_k=1+k_chunks=8+zeros_by_x_sums=0+words_in_shared=1 \
    block_n=16+num_warps=4+split_k=1+k_chunks=8+zeros_by_x_sums=0
