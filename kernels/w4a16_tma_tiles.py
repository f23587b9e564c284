"""Tiles of the TMA-fed wgmma W4A16 kernel (``tamis.kernels.w4a16_wgmma_tma``): its
knobs (``TmaConfig``), the tile each call of M rows on a [K, N] layer gets
(``pick_tma_config``), and how rows of x map to row blocks and TMA boxes.
"""
from __future__ import annotations

from dataclasses import dataclass

TMA_MAX_M = 256  # rows of x the kernel takes, in blocks of up to 128 (``tma_block_m``)
X_BOX_K = 64   # rows of K per x box and per wgmma: 128 bytes of bf16, the swizzle's span
SHARED_BYTES = 200 * 1024  # of Hopper's 227 KB per block: the ring of tiles


@dataclass(frozen=True)
class TmaConfig:
    block_n: int = 64     # output columns per program: 64 per warpgroup
    block_k: int = 128    # rows of K per step (64 or 128; inside one group)
    split_k: int = 4      # programs along K per column block
    num_warps: int = 4    # 4 (one warpgroup) or 8
    stages: int = 4       # ring slots; every slot's tiles are in flight ahead
    params_ahead: int = 2  # steps ahead that the scales and zero points load (1 or 2)
    # The next step's unpack while this step's wgmmas run (else it waits for them first;
    # the second half's unpack overlaps the first half's wgmma either way).
    overlap: bool = True
    block_m: int = 0      # rows of x per program (0: M rounded up, ``tma_block_m``)
    # Split K summed by the last split, the others not waiting for the counter
    # (``_reduce_at_last_split``), instead of by the last to arrive.
    last_split_reduces: bool = False
    # With last_split_reduces: the partials stored and loaded in thread order, as
    # 16-byte vectors (``_reduce_linear_at_last_split``).
    linear_partials: bool = False
    # One extra warp issues every TMA copy (``_produce``) while the warpgroup(s) only wait,
    # unpack and multiply (``_consume``): Triton's shared-memory barrier analysis puts a
    # barrier of the program's threads around each TMA copy and its mbarrier (five a
    # step besides the slot's release), which in one warp cost nothing.
    producer_warp: bool = False
    # Registers a thread capped at (0: ptxas's choice; the producer warp's tiles take
    # PRODUCER_WARP_MAXNREG): 128-row blocks of x fit three programs a multiprocessor
    # at 168.
    maxnreg: int = 0


def pick_tma_config(m: int, n: int, k: int, group_size: int, num_sms: int = 132) -> TmaConfig:
    """Tiles, the fastest of their sweeps with weights read from DRAM
    (bench/results/quant.md), steps of 128 rows of K (64 where the group is 64 rows).
    Wide layers (N >= 8192), K unsplit: above 32 rows 128 columns on one warpgroup over
    four slots, the next step's unpack overlapping this step's wgmmas, else 64 columns
    over two. Others: 64 columns over two slots without the overlap, K split until the
    column blocks make about two programs per multiprocessor while each split keeps at
    least 8 steps (4 ways on 4096-deep layers, 8 on 14336), and up to 16 rows at least 8
    ways while each split keeps 4 steps, summed as ``_sums_at_last_split`` says; above
    32 rows with the producer warp where ``_producer_split`` finds a split that fills the
    GPU with it. Above 64 rows, ``_tile_of_128_rows``."""
    block_k = 128 if group_size >= k or group_size % 128 == 0 else 64
    if m > 64:
        return _tile_of_128_rows(m, n, k, block_k, num_sms)
    if n >= 8192:
        if m > 32:
            return TmaConfig(128, block_k, 1, 4, 4, overlap=True)
        return TmaConfig(64, block_k, 1, 4, 2, overlap=False)
    block_m = tma_block_m(m)
    blocks = -(-n // 64) * -(-m // block_m)
    split = 1
    while blocks * split < 2 * num_sms and k // (block_k * split * 2) >= 8:
        split *= 2
    if block_m <= 16:  # 8 splits (4 steps each on 4096-deep layers) win
        while split < 8 and k // (block_k * split * 2) >= 4:
            split *= 2
    producer = block_m > 32 and _producer_split(blocks, split, k // block_k, num_sms,
                                                halve=m <= 64)
    split = producer or split
    at_last = _sums_at_last_split(block_m, split)
    return TmaConfig(64, block_k, split, 4, 2, overlap=False, last_split_reduces=at_last,
                     linear_partials=at_last, producer_warp=bool(producer))


def _tile_of_128_rows(m: int, n: int, k: int, block_k: int, num_sms: int) -> TmaConfig:
    """65..256 rows: blocks of 128 rows of x (the wgmma's N = 128, so each word is
    unpacked once per 128 rows, against twice in 64-row blocks, which it beats on every
    shape: bench/results/quant.md), two slots, no overlap. Narrow layers: 64 columns, K
    split while the programs fit three a multiprocessor (the tile's shared memory, and
    its registers capped at 168 from 4 splits, whose sum otherwise takes 174) and each
    split keeps 8 steps. Wide layers (N >= 8192), K unsplit: 128 columns on two
    warpgroups in one block of rows, 64 columns on one in two. The wide layers'
    two-warpgroup tile is capped at 128 registers, two programs a multiprocessor whatever
    its boxes (``x_box_rows``). Register counts differ between Triton releases (3.6
    builds some of these tiles to more registers than 3.9, one program a multiprocessor
    fewer): ``tests/kernels/test_sm90_builds_under_h200_triton.py`` checks the builds
    under both."""
    if n >= 8192:
        if m <= 128:
            return TmaConfig(128, block_k, 1, 8, 2, overlap=False, block_m=128, maxnreg=128)
        return TmaConfig(64, block_k, 1, 4, 2, overlap=False, block_m=128)
    blocks = -(-n // 64) * -(-m // 128)
    split = 1
    while blocks * split * 2 <= 3 * num_sms and k // (block_k * split * 2) >= 8:
        split *= 2
    return TmaConfig(64, block_k, split, 4, 2, overlap=False, block_m=128,
                     last_split_reduces=split > 1, linear_partials=split > 1,
                     maxnreg=168 if split >= 4 else 0)


def _producer_split(blocks: int, split: int, steps: int, num_sms: int, halve: bool) -> int:
    """The K split with the producer warp (0: none), for a narrow layer above 32 rows
    split ``split`` ways. The warp makes a program two warpgroups, of which two fit a
    multiprocessor (``PRODUCER_WARP_MAXNREG``), so it pays only where the programs fill
    1.5-2 per multiprocessor in one wave, halving the split to get there if each split
    keeps 8 steps. At 17..32 rows it does not pay, nor does halving over several 64-row
    blocks of x (``halve`` false; bench/results/quant.md)."""
    while (halve and blocks * split > 2 * num_sms and split > 1
           and steps // (split // 2) >= 8):
        split //= 2
    return split if 1.5 * num_sms < blocks * split <= 2 * num_sms else 0


def _sums_at_last_split(block_m: int, splits: int) -> bool:
    """Whether split K is summed by the last split through partials in thread order
    (``last_split_reduces`` and ``linear_partials``), else by the last split to arrive;
    whichever won its A/B (bench/results/quant.md): above 16 rows, by the last split in
    thread order (their 16-byte accesses also take the 64-row tile from 168 registers to
    111, so 8 splits stay one wave); up to 16 rows the same with 8 splits or more, else
    by arrival."""
    return splits > 1 and (block_m > 16 or splits >= 8)


def slot_bytes(block_k: int, block_n: int, block_m: int) -> int:
    """Bytes of one ring slot, which its TMA copies bring: the words of block_k rows of K
    (8 codes an int32) for block_n columns, and block_m rows of x by block_k (bf16)."""
    return block_k // 8 * block_n * 4 + block_m * block_k * 2


def shared_bytes(config: TmaConfig, block_m: int) -> int:
    """Shared memory of one program's ring."""
    return config.stages * slot_bytes(config.block_k, config.block_n, block_m)


def tma_block_m(m: int) -> int:
    """Rows of x per program (the wgmma's N): M rounded up to 8, 16, 32, 64 or 128;
    above 128 rows, blocks of 128."""
    for block_m in (8, 16, 32, 64):
        if m <= block_m:
            return block_m
    return 128


# Rows past x a whole box of a single row block may reach (``x_box_rows``), by the
# tile's warps: one warpgroup, two.
MOST_ROWS_PAST_X = {4: 16, 8: 40}


def launched_rows(m: int) -> int:
    """The M a launch on m rows of x states: m rounded up to a multiple of 16. The rows
    past m read as zeros (x's descriptor has its true rows) and land in output rows that
    are cut off (``w4a16_gemm_wgmma_tma`` returns the first m). Triton specialises M on
    whether 16 divides it, and the other build of the 64-row tile needs 144 registers
    instead of 113: 3 programs a multiprocessor instead of 4, so a split launch of 512
    programs takes two waves (14336 x 4096 at 72 rows: 56.7 us, with launched rows
    38.3)."""
    return -(-m // 16) * 16


def x_box_rows(m: int, block_m: int, num_warps: int = 4) -> int:
    """Rows of x per TMA box: the row block's, except where a single block holds every
    row, the launched rows (``launched_rows``) fill more than half of it and a whole box
    would reach more than ``MOST_ROWS_PAST_X[num_warps]`` rows past x: then half, two
    boxes a tile, the second ending at the launched rows (overlapping the first;
    ``_tile_rows``). Why: rows of a box past the end of x, which the TMA fills with
    zeros, cost as much as rows read or more, and a second box costs a copy. Halves
    against a whole box (bench/results/quant.md): one warpgroup, 33 / 40 rows on
    4096 x 4096 11.3 / 11.0 against 14.0 / 12.0 us (at 48 rows, 16 past x, halves lose
    by up to 0.5 us), 72 / 96 rows 15.2 / 14.7 against 20.6 / 17.0; two warpgroups
    (4096 x 28672 under the 128-register cap of ``_tile_of_128_rows``), 65 / 72 / 80
    rows 60 against 73 / 69 / 65 us, while from 88 rows the whole box wins (58 against
    61 us)."""
    rows = launched_rows(m)
    if block_m // 2 < rows < block_m and block_m - m > MOST_ROWS_PAST_X[num_warps]:
        return block_m // 2
    return block_m
