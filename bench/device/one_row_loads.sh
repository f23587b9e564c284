#!/usr/bin/env bash
# One device call: the chunked one-row tile's GPU tests, then the chunked tile with two
# steps a load (a 512-row chunk's four steps all in flight at once) or one unpaired
# step a load, against the defaults on the narrow layers.
source bench/device/carried.sh && tamis_env
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 100 python3 -P -m pytest -q -o pythonpath= -m gpu tests/kernels/test_w4a16_mma.py \
    -k chunks_of_k 2>&1 | grep -v Warning | tail -4
c=block_n=32+num_warps=8+split_k=1+k_chunks=8
ab_one_row 70 --shapes 4096x4096 --rounds 3 --field $c $c+paired_steps=0+load_steps=2 \
    $c+paired_steps=0 block_n=16+num_warps=4+split_k=1+k_chunks=8+paired_steps=0+load_steps=2
ab_one_row 70 --shapes 4096x6144 --rounds 3 --field paired_steps=0+load_steps=2 \
    paired_steps=0+load_steps=2+max_registers=128 paired_steps=0 \
    block_n=16+num_warps=4+paired_steps=0+load_steps=2
