"""The Gluon W4A16 kernels built for sm_90 without a GPU (``sm90_build``): they compile
with the installed Triton, their layout conversions are trivial (asserted while
compiling), nothing spills, the tensor-core instructions are there, and no instruction
overwrites the registers of a wgmma still in flight. The GPU tests check their results."""
from __future__ import annotations

import dataclasses
import sys
import statistics
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from sm90_build import inflight_clobbers, load_leads, parse_sass  # noqa: E402
from w4a16_sm90_builds import mma_build, tma_build, wgmma_build  # noqa: E402

from tamis.kernels import (w4a16_mma, w4a16_mma_tiles, w4a16_tma_tiles,  # noqa: E402
                           w4a16_wgmma_tma)

needs_gluon = pytest.mark.skipif(w4a16_mma.gluon is None, reason="triton without Gluon")


def _listing(*lines: str) -> str:
    return "\n".join(f"        /*{16 * i:04x}*/                   {line} ;"
                     for i, line in enumerate(lines))


def test_checker_flags_a_write_to_registers_of_a_wgmma_in_flight():
    sass = _listing("HGMMA.64x64x16.F32.BF16 R24, R56, gdesc[UR8], R24, gsb0",
                    "IMAD R58, R1, R2, RZ",
                    "WARPGROUP.DEPBAR.LE gsb0, 0x0",
                    "IMAD R59, R1, R2, RZ")
    found = inflight_clobbers(parse_sass(sass))
    assert len(found) == 1 and "R58" in found[0]


def test_checker_follows_the_loop_back_edge():
    sass = _listing("IMAD.WIDE R56, R1, 0x4, R2",          # loop top: writes R56, R57
                    "HGMMA.64x64x16.F32.BF16 R24, R56, gdesc[UR8], R24, gsb0",
                    "WARPGROUP.DEPBAR.LE gsb0, 0x1",        # one group left in flight
                    "@P0 BRA 0x0000",
                    "WARPGROUP.DEPBAR.LE gsb0, 0x0")
    found = inflight_clobbers(parse_sass(sass))
    assert len(found) == 1 and "IMAD.WIDE" in found[0]


def test_checker_passes_writes_after_the_wait_and_to_other_registers():
    sass = _listing("HGMMA.64x64x16.F32.BF16 R24, R56, gdesc[UR8], R24, gsb0",
                    "IMAD R60, R1, R2, RZ",
                    "LDG.E.128 R52, desc[UR4][R2.64]",      # R52..R55
                    "STG.E desc[UR4][R56.64], R1",          # reads R56, writes memory
                    "WARPGROUP.DEPBAR.LE gsb0, 0x0",
                    "IMAD R56, R1, R2, RZ")
    assert inflight_clobbers(parse_sass(sass)) == []


def _before_the_wait(build) -> list[str]:
    """Opcodes up to the PDL wait (``ACQBULK``, griddepcontrol.wait); fails without one."""
    opcodes = [i.opcode for i in build.instructions()]
    assert opcodes.count("ACQBULK") == 1, "expected one griddepcontrol.wait"
    return opcodes[:opcodes.index("ACQBULK")]


@needs_gluon
@pytest.mark.parametrize("block_m,block_n,block_k,warps,stages,split,even,pairs", [
    (32, 128, 128, 4, 2, False, True, False),   # wide layers, 17..32 rows, two slots
    (64, 128, 128, 4, 2, False, True, False),   # wide layers, 33..64 rows
    (64, 128, 128, 4, 2, True, True, False),    # deep layers, 33..64 rows, split K
    (64, 64, 128, 4, 3, True, True, False),     # the narrow default, split K
    (32, 64, 32, 4, 3, True, False, False),     # 32-row groups, masked tails
    (64, 256, 64, 8, 3, True, True, False),     # two warpgroups
    (64, 64, 128, 4, 3, False, True, True),     # steps in pairs
    (32, 64, 128, 4, 4, True, True, True),      # 17..32 rows, narrow (dispatched)
    (32, 128, 128, 4, 3, False, True, True),    # 17..32 rows, wide (dispatched)
    (64, 64, 64, 4, 3, True, False, True),
])
def test_wgmma_kernel_builds_for_sm90_without_hazards(block_m, block_n, block_k, warps,
                                                      stages, split, even, pairs):
    build = wgmma_build(block_m, block_n, block_k, warps, stages, split, even, pairs)
    assert build.count("HGMMA") > 0, "no wgmma in the SASS"
    assert build.stack_bytes == 0, f"{build.stack_bytes} bytes of stack (spills)"
    assert inflight_clobbers(build.instructions()) == []


@needs_gluon
@pytest.mark.parametrize("pairs", [False, True])
def test_wgmma_kernel_with_params_one_step_ahead_builds_without_hazards(pairs):
    build = wgmma_build(64, 64, 128, 4, 3, True, True, pairs, params_ahead=1)
    assert build.count("HGMMA") > 0, "no wgmma in the SASS"
    assert build.stack_bytes == 0, f"{build.stack_bytes} bytes of stack (spills)"
    assert inflight_clobbers(build.instructions()) == []


@needs_gluon
@pytest.mark.parametrize("block_m,config", [
    (8, w4a16_mma_tiles.MmaConfig(128, 128, 8, 4, params_ahead=True)),               # M = 1
    (8, w4a16_mma_tiles.MmaConfig(128, 128, 8, 4, params_ahead=False)),
    (16, w4a16_mma_tiles.MmaConfig(64, 128, 4, 2, load_steps=2, vector_columns=False)),
    (16, w4a16_mma_tiles.MmaConfig(64, 128, 4, 2, load_steps=2, vector_columns=False,
                             params_ahead=True)),
    (8, w4a16_mma_tiles.MmaConfig(128, 128, 8, 4, params_ahead=True, paired_steps=True)),
])
def test_mma_kernel_builds_for_sm90(block_m, config):
    build = mma_build(block_m, config)
    assert build.count("HMMA") > 0, "no mma.sync in the SASS"
    assert build.stack_bytes == 0, f"{build.stack_bytes} bytes of stack (spills)"


@needs_gluon
@pytest.mark.parametrize("k,n", [(4096, 4096), (4096, 6144), (4096, 28672), (14336, 4096)])
def test_one_row_tiles_fit_the_programs_one_wave_split_counts_on(k, n):
    """``one_wave_split`` counts 16 / num_warps resident programs a multiprocessor: the
    one-row tiles must build to at most 128 registers (65536 a multiprocessor); those
    summed by their last split count their partners in with a RED (no wait for it)."""
    config = w4a16_mma_tiles.split_one_row_config(n, k, 128)
    assert config.split_k > 1
    build = mma_build(8, config, k=k)
    assert build.registers <= 128, f"{build.registers} registers: fewer programs resident"
    assert build.stack_bytes == 0
    if config.last_split_reduces:
        assert build.count("REDG") + build.count("RED") >= 1, "partners wait for the count"


@needs_gluon
def test_padded_chunked_grid_builds_the_unpadded_loop():
    """``whole_wave``'s extra programs only remap their column block and store nothing:
    4096 x 4096's one-row default (the chunked tile, 128 column blocks padded to 132)
    builds within its register cap, with no spill, to the unpadded tile's steps (the
    same MMAs; ptxas may schedule a few instructions differently)."""
    config = w4a16_mma_tiles.pick_mma_config(1, 4096, 4096, 128, 132)
    assert config.whole_wave
    padded = mma_build(8, config, k=4096, real_blocks=128)
    plain = mma_build(8, config, k=4096)
    assert padded.registers <= 128 and padded.stack_bytes == 0
    steps, plain_steps = _steps(padded), _steps(plain)
    assert [x.opcode for x in steps].count("HMMA.16816.F32.BF16") == \
        [x.opcode for x in plain_steps].count("HMMA.16816.F32.BF16")
    assert len(steps) <= len(plain_steps) + 8, "the remap reached the steps"


@needs_gluon
@pytest.mark.parametrize("k,n", [(4096, 4096), (4096, 6144)])
def test_chunks_of_four_steps_load_them_all_up_front(k, n):
    """``steps_up_front`` (the one-row default on the narrow Llama-3.1-8B layers, chunks
    of 4 steps): under its cap the tile builds to at most 120 registers (two programs of
    8 warps a multiprocessor), no spill, and its 16-byte loads after the PDL wait issue
    a step or more (16 MMAs) before their use, at the median. Without the cap ptxas
    builds 84 registers with each load 7 MMAs ahead at the median: the round trips the
    tile exists to overlap."""
    config = w4a16_mma_tiles.pick_mma_config(1, n, k, 128, 132)
    assert config.steps_up_front and config.max_registers
    build = mma_build(8, config, pdl_trigger=1, k=k)
    assert build.registers <= 120 and build.stack_bytes == 0
    ins = build.instructions()
    after = ins[[x.opcode for x in ins].index("ACQBULK") + 1:]
    loads = [x for x in after if x.opcode.startswith("LDG")]
    leads = [lead for lead, x in zip(load_leads(after), loads)
             if x.opcode.startswith("LDG.E.128")]
    assert statistics.median(leads) >= 16, sorted(leads)


def _steps(build) -> list:
    """The instructions that run a program's steps: its main loop where it has one, else
    (steps unrolled, ``steps_up_front``) those from its first MMA to its last."""
    ins = build.instructions()
    if any(x.opcode == "BRA" and x.operands and int(x.operands[0], 16) < x.address
           for x in ins):
        return _main_loop(build)
    mmas = [i for i, x in enumerate(ins) if x.opcode.startswith("HMMA")]
    return ins[mmas[0]:mmas[-1] + 1]


def _main_loop(build) -> list:
    """The instructions of the longest loop (from a backward branch's target to it)."""
    ins = build.instructions()
    spans = [(int(x.operands[0], 16), x.address) for x in ins
             if x.opcode == "BRA" and x.operands and int(x.operands[0], 16) < x.address]
    start, stop = max(spans, key=lambda span: span[1] - span[0])
    return [x for x in ins if start <= x.address <= stop]


@needs_gluon
@pytest.mark.parametrize("k,n", [(4096, 4096), (4096, 6144), (4096, 28672), (14336, 4096)])
def test_one_row_loop_spends_its_instructions_on_the_words(k, n):
    """At one row every instruction of the main loop (or unrolled steps) outside the
    unpack and the MMAs is overhead the GPU pays for (6-9% faster without the ones
    below): the scales load as vectors (no 16-bit loads), the zero points
    become bf16 without float conversions, x loads unmasked (no zeroing of its registers
    before the loads), and at most 150 instructions of the loop (of 2 steps, 32 words a
    thread) are not the 11 of each word's unpack or its MMA."""
    config = w4a16_mma_tiles.pick_mma_config(1, n, k, 128)
    loop = _steps(mma_build(8, config, k=k))
    opcodes = [x.opcode for x in loop]
    assert not [op for op in opcodes if op.startswith("LDG.E.U16")]
    if not config.zeros_by_x_sums:  # else 128 + z is an fp32 sum on purpose
        assert not [op for op in opcodes if op.startswith(("F2F", "F2FP", "FADD"))]
    # two zeroed pairs a load of predicated group parameters: two loads a loop pass, or
    # the three loads of steps_up_front
    assert opcodes.count("CS2R") <= (6 if config.steps_up_front else 4)
    words = opcodes.count("HMMA.16816.F32.BF16")
    assert words > 0
    overhead = len(opcodes) - _words_own(config) * words
    assert overhead <= 150, f"{overhead} instructions besides the words' own"


def _words_own(config) -> int:
    """A word's instructions at one row: 3 shifts, 4 ``lop3``, (4 bf16x2 FMAs applying the
    zero point, unless it comes off by sums of x) and one MMA."""
    return 8 if config.zeros_by_x_sums else 12


@needs_gluon
@pytest.mark.parametrize("k,n", [(4096, 4096), (4096, 6144), (4096, 28672), (14336, 4096)])
def test_zero_points_by_x_sums_leave_the_words_8_instructions_and_the_loads_ahead(k, n):
    """With zero points by sums of x a word costs 8 instructions, not 12, and (built
    with ``mma_compile_options``' register cap) every load of the loop still issues at
    least 6 MMAs before its first use, as in the per-word loop: without the cap ptxas
    put some right before their use (0 MMAs), a memory round trip exposed per pair of
    steps (9.3 against 7.1 us on 4096 x 6144)."""
    config = dataclasses.replace(w4a16_mma_tiles.split_one_row_config(n, k, 128),
                                 zeros_by_x_sums=True)
    build = mma_build(8, config, k=k)
    assert build.registers <= 128 and build.stack_bytes == 0
    loop = _main_loop(build)
    words = sum(x.opcode.startswith("HMMA") for x in loop)
    assert len(loop) - _words_own(config) * words <= 150
    assert sum(x.opcode.startswith("HADD2") for x in loop) <= words, "zero point FMAs left"
    assert min(load_leads(loop)) >= 6


_WRITES = ("STG", "RED", "ATOM", "ATOMG", "STS")


@needs_gluon
@pytest.mark.parametrize("trigger", [0, 1, 2])
@pytest.mark.parametrize("block_m,config", [
    (8, w4a16_mma_tiles.MmaConfig(128, 128, 8, 4, params_ahead=True)),               # M = 1
    (16, w4a16_mma_tiles.MmaConfig(64, 128, 4, 2, load_steps=2, vector_columns=False,
                             params_ahead=True)),
    (16, w4a16_mma_tiles.MmaConfig(128, 128, 8, 8, vector_columns=False)),
])
def test_mma_kernel_with_pdl_writes_nothing_before_the_wait(block_m, config, trigger):
    """Launched with PDL the kernel may run beside the one before it: no global or
    shared store, no atomic, before griddepcontrol.wait, and a trigger (PREEXIT) where
    asked (1: before the wait, 2: after it)."""
    build = mma_build(block_m, config, pdl_trigger=trigger)
    before = _before_the_wait(build)
    assert not [op for op in before if op.split(".")[0] in _WRITES]
    assert any(op.startswith("LDG") for op in before), "no weight load ahead of the wait"
    opcodes = [i.opcode for i in build.instructions()]
    assert opcodes.count("PREEXIT") == (trigger > 0)
    if trigger:
        assert ("PREEXIT" in before) == (trigger == 1)
    assert build.stack_bytes == 0


@needs_gluon
@pytest.mark.parametrize("block_n,warps,chunks,by_sums", [
    (32, 8, 8, False), (16, 4, 8, False), (64, 4, 2, False), (32, 4, 8, True)])
def test_chunks_of_k_sum_in_the_program(block_n, warps, chunks, by_sums):
    """``k_chunks`` at one row: no split-K partials, counter or atomics (the chunks sum
    through shared memory in the program), words as 16-byte vectors with the first
    step's before griddepcontrol.wait and nothing written before it, x's chunks as
    16-byte vectors, no spills; by sums of x (each chunk's sums its column's) no zero
    point in bf16."""
    config = w4a16_mma_tiles.MmaConfig(block_n, 128, 1, warps, params_ahead=True,
                                 paired_steps=True, k_chunks=chunks, zeros_by_x_sums=by_sums)
    build = mma_build(8, config, pdl_trigger=1, k=4096)
    assert build.registers <= 128 and build.stack_bytes == 0
    full = [i.opcode for i in build.instructions()]
    opcodes = [op.split(".")[0] for op in full]
    assert not [op for op in opcodes if op in ("ATOM", "ATOMG", "RED", "REDG")]
    before = _before_the_wait(build)
    assert not [op for op in before if op.split(".")[0] in _WRITES]
    assert "LDG.E.128" in before, before
    # x's chunks too load as 16-byte vectors (told the chunk is whole steps)
    assert "LDG.E" not in full
    assert opcodes.count("HMMA") > 0 and opcodes.count("STS") > 0
    # by sums of x no word's zero point is applied in bf16
    assert (full.count("HADD2.BF16_V2") == 0) == by_sums


@needs_gluon
@pytest.mark.parametrize("trigger", [0, 1, 2])
@pytest.mark.parametrize("block_m,block_n,warps,stages,split,even,pairs", [
    (64, 64, 4, 3, True, True, False),      # the narrow default at 33..64 rows
    (32, 64, 4, 4, True, True, True),       # 17..32 rows, narrow
    (32, 64, 4, 4, True, False, True),      # masked tails
])
def test_wgmma_kernel_with_pdl_copies_only_words_before_the_wait(
        block_m, block_n, warps, stages, split, even, pairs, trigger):
    """Before the wait: the ring's first word tiles (cp.async) and the scales, no store
    and no x^T copy: the cp.async copies before it are the words' (4 bytes each, one
    tile of BLOCK_N x 16 words a step over the program's threads)."""
    build = wgmma_build(block_m, block_n, 128, warps, stages, split, even, pairs,
                         pdl_trigger=trigger)
    before = _before_the_wait(build)
    assert not [op for op in before if op.split(".")[0] in _WRITES]
    ahead = stages - 1 - pairs
    word_copies = ahead * block_n * 16 // (32 * warps)
    assert sum(op.startswith("LDGSTS") for op in before) == word_copies
    assert inflight_clobbers(build.instructions()) == []
    assert build.stack_bytes == 0


_TMA_CONFIGS = [
    (32, w4a16_tma_tiles.TmaConfig(64, 128, 4, 4, 2, overlap=False)),   # 17..32, narrow
    (32, w4a16_tma_tiles.TmaConfig(64, 128, 1, 4, 2, overlap=False)),   # 17..32, wide
    (64, w4a16_tma_tiles.TmaConfig(64, 128, 4, 4, 2, overlap=True)),    # 33..64, narrow
    (64, w4a16_tma_tiles.TmaConfig(128, 128, 1, 4, 4, overlap=True)),   # 33..64, wide
    (64, w4a16_tma_tiles.TmaConfig(64, 64, 4, 4, 3, overlap=True)),     # 64-row groups
    (64, w4a16_tma_tiles.TmaConfig(128, 128, 2, 8, 2, overlap=True)),   # two warpgroups
    (64, w4a16_tma_tiles.TmaConfig(64, 128, 2, 4, 3, 1, overlap=False)),
    (32, w4a16_tma_tiles.TmaConfig(64, 128, 8, 4, 2, overlap=False, last_split_reduces=True)),
    (64, w4a16_tma_tiles.TmaConfig(64, 128, 4, 4, 2, overlap=True, last_split_reduces=True)),
    (64, w4a16_tma_tiles.TmaConfig(64, 128, 4, 4, 2, overlap=False, last_split_reduces=True)),
    (64, w4a16_tma_tiles.TmaConfig(64, 128, 8, 4, 2, overlap=False, last_split_reduces=True,
                                   linear_partials=True)),
]


@needs_gluon
@pytest.mark.parametrize("block_m,config", _TMA_CONFIGS)
def test_tma_kernel_builds_for_sm90_without_hazards(block_m, config):
    build = tma_build(block_m, config)
    assert build.count("HGMMA") > 0, "no wgmma in the SASS"
    assert build.count("UTMALDG") > 0, "no TMA load in the SASS"
    assert build.count("LDGSTS") == 0, "tiles copied by the threads, not the TMA"
    assert build.stack_bytes == 0, f"{build.stack_bytes} bytes of stack (spills)"
    assert inflight_clobbers(build.instructions()) == []


@needs_gluon
@pytest.mark.parametrize("m,k,n", [(128, 4096, 4096), (72, 4096, 6144), (200, 14336, 4096),
                                   (72, 4096, 28672), (100, 4096, 28672), (200, 4096, 28672)])
def test_tiles_of_128_rows_fit_three_programs_a_multiprocessor(m, k, n):
    """Above 64 rows, 128-row blocks of x: the narrow layers' tiles fit the 168
    registers by which ``_tile_of_128_rows`` counts three programs a multiprocessor
    (at 4 K splits capped there: ptxas then spills a few registers in the loop, which
    timed faster than two programs a multiprocessor), the wide layers' 8-warp tile two,
    in whole boxes (100 rows) or half boxes (72), with at most 32 bytes of stack; no
    wgmma operand overwritten in flight. With the installed Triton; under Triton 3.6,
    whose builds differ (``_tile_of_128_rows``), through
    ``test_sm90_builds_under_h200_triton.py``."""
    config = w4a16_tma_tiles.pick_tma_config(m, n, k, 128)
    assert config.block_m == 128
    build = tma_build(128, config, rows=m)
    assert build.registers <= 168
    if config.num_warps == 8:
        assert build.registers <= 128 and build.stack_bytes <= 32
    assert inflight_clobbers(build.instructions()) == []


@needs_gluon
@pytest.mark.parametrize("rows,block_m", [(72, 128), (40, 64)])
def test_a_block_with_more_than_16_empty_rows_copies_x_in_two_half_boxes(rows, block_m):
    """Where x's rows leave more than 16 rows of the one row block empty (and fill more
    than half of it), x comes in two half boxes a tile (``x_box_rows``): twice the x
    copies, the same wgmmas."""
    config = w4a16_tma_tiles.pick_tma_config(rows, 4096, 4096, 128)
    assert w4a16_tma_tiles.x_box_rows(rows, block_m) == block_m // 2
    halves = tma_build(block_m, config, rows=rows)
    whole = tma_build(block_m, config)
    assert halves.count("HGMMA") == whole.count("HGMMA")
    assert halves.count("UTMALDG") > whole.count("UTMALDG")
    assert inflight_clobbers(halves.instructions()) == []


_PRODUCER_CONFIGS = [
    (64, w4a16_tma_tiles.TmaConfig(64, 128, 4, 4, 2, overlap=False, last_split_reduces=True,
                                   linear_partials=True, producer_warp=True)),
    (64, w4a16_tma_tiles.TmaConfig(64, 128, 1, 4, 4, overlap=True, producer_warp=True)),
    (32, w4a16_tma_tiles.TmaConfig(64, 64, 2, 4, 4, 1, overlap=False, producer_warp=True)),
]


@needs_gluon
@pytest.mark.parametrize("block_m,config", _PRODUCER_CONFIGS)
def test_tma_kernel_with_a_producer_warp_issues_its_copies_without_barriers(block_m, config):
    """With the producer warp no barrier of the program's threads stands between two
    TMA copies (without it, Triton's barrier analysis puts one before each copy), the
    computing warps' loop keeps two (the slot's release and the loop's head; three with
    the overlap) where it had one more per TMA copy, and the registers stay at the cap
    that lets two programs share a multiprocessor."""
    build = tma_build(block_m, config)
    assert inflight_clobbers(build.instructions()) == []
    assert build.stack_bytes == 0, f"{build.stack_bytes} bytes of stack (spills)"
    assert build.registers <= w4a16_wgmma_tma.PRODUCER_WARP_MAXNREG
    opcodes = [i.opcode for i in build.instructions()]
    copies = [i for i, op in enumerate(opcodes) if op.startswith("UTMALDG")]
    assert len(copies) >= 2 * config.stages
    between = [op for a, b in zip(copies, copies[1:]) for op in opcodes[a:b]
               if op.startswith("BAR.SYNC")]
    assert between == [], "a barrier between the producer's TMA copies"
    in_loop = _main_loop_barriers(build)
    assert in_loop <= 2 + config.overlap
    plain = tma_build(block_m, dataclasses.replace(config, producer_warp=False))
    assert _main_loop_barriers(plain) >= in_loop + 2 * config.block_k // 64


def _main_loop_barriers(build) -> int:
    """Barriers of the program's threads in the loop around the first wgmma: from the
    target of the first backward branch after it to that branch."""
    ins = build.instructions()
    first = next(i for i, x in enumerate(ins) if x.opcode.startswith("HGMMA"))
    for i in range(first, len(ins)):
        if ins[i].opcode == "BRA":
            target = int(ins[i].operands[0], 16)
            if target <= ins[first].address:
                return sum(x.opcode.startswith("BAR.SYNC") for x in ins
                           if target <= x.address <= ins[i].address)
    raise AssertionError("no loop around the wgmma")


@needs_gluon
@pytest.mark.parametrize("m,n,k,splits", [(64, 6144, 4096, 4), (32, 4096, 14336, 8)])
def test_tma_kernel_sums_through_vector_partials_in_one_wave(m, n, k, splits):
    """Above 16 rows the partials in thread order move as 16-byte vectors (8 stores of
    4 values a thread at 64 rows; the last split 8 loads a partner), and the 64-row tile
    stays within 128 registers: 4 programs a multiprocessor, so 6 column blocks a
    multiprocessor split 4 ways (384 programs), or 8 splits of 64 column blocks (512
    programs), are one wave."""
    config = w4a16_tma_tiles.pick_tma_config(m, n, k, 128)
    assert config.linear_partials and config.split_k == splits
    assert not config.producer_warp
    build = tma_build(64, config)
    assert build.registers <= 128, f"{build.registers} registers: under 4 programs an SM"
    assert build.stack_bytes == 0
    opcodes = [i.opcode for i in build.instructions()]
    assert opcodes.count("STG.E.128") == 8
    assert sum(o.startswith("LDG.E.128") for o in opcodes) == 8 * (splits - 1)


@needs_gluon
@pytest.mark.parametrize("trigger", [0, 1, 2])
@pytest.mark.parametrize("block_m,config", _TMA_CONFIGS[2:5])
def test_tma_kernel_with_pdl_loads_only_words_before_the_wait(block_m, config, trigger):
    """Before the wait: the ring's word boxes (one TMA load per 64 rows of K a slot)
    and the scales, no store and none of x's boxes."""
    build = tma_build(block_m, config, pdl_trigger=trigger)
    before = _before_the_wait(build)
    assert not [op for op in before if op.split(".")[0] in _WRITES]
    halves = config.block_k // 64
    assert sum(op.startswith("UTMALDG") for op in before) == config.stages * halves
    assert build.count("UTMALDG") > config.stages * halves
    assert build.stack_bytes == 0
