"""Tiles of the MMA-fragment W4A16 kernel (``tamis.kernels.w4a16_mma``): its knobs
(``MmaConfig``) and the tile each call of M rows on a [K, N] layer gets
(``pick_mma_config``), with the rules the launcher checks a config against.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from tamis.kernels.w4a16_common import step_rows


@dataclass(frozen=True)
class MmaConfig:
    block_n: int = 128      # output columns per program (16 per warp per MMA row block)
    block_k: int = 128      # rows of K per step (inside one group)
    split_k: int = 8        # programs along K per column block
    num_warps: int = 8
    max_block_m: int = 16   # rows of x per program (more rows: a grid axis)
    # Steps (of block_k rows) whose words and x load together: more bytes in flight per
    # thread (1 or 2). Each load's words are loaded a load ahead.
    load_steps: int = 1
    # Output columns permuted so that a thread's words are adjacent (``column_order``).
    vector_columns: bool = True
    # The next load's x tile, scales and zero points load with its words, a load ahead
    # (else each step waits for its own: one more memory round trip per step, the group's
    # scales coming from DRAM). Costs registers: it wins at M = 1 and with two steps a
    # load, loses elsewhere.
    params_ahead: bool = False
    # With params_ahead and one step a load: the loop runs steps in pairs, the two loads
    # in flight in two sets of registers that alternate, instead of one set copied into
    # the other every step (the SASS of the M = 1 tile spent 45 of its 333 instructions
    # a step on those copies).
    paired_steps: bool = False
    # Split K summed by the last split, its partner splits not waiting for the counter
    # (``_reduce_at_last_split``), instead of by the last to arrive.
    last_split_reduces: bool = False
    # With paired_steps: the codes unpack as 128 + q (no zero point: 7 instructions a
    # word, not 11) and each step's product is corrected in fp32 by (128 + z) times the
    # step's sum of x, summed once per program before the loop (``_x_step_sums``).
    zeros_by_x_sums: bool = False
    # ptxas's register cap for the build (maxnreg); 0 leaves it to the compiler (or to
    # ``mma_compile_options``' own cap).
    max_registers: int = 0
    # At one row (M == 1), 2, 4 or 8: the MMA's 8 columns of x^T (7 of them padding at
    # one row) carry that many chunks of the split's rows of K instead (16: two blocks
    # of 8 columns, two MMAs a word), and the tile's
    # block_n * k_chunks rows are (chunk, column) pairs, each loading its chunk's words:
    # a program sums all of its split itself (``_store_chunk_sums``: one cross-warp sum)
    # where split K would sum through global partials and a counter. Loads a step ahead
    # (params_ahead; paired steps, or one or two steps a load), one split (split_k 1).
    # With zeros_by_x_sums each chunk's step sums are column j's (the chunks read as rows
    # of x).
    k_chunks: int = 0
    # With k_chunks: the grid padded to a whole number of programs a multiprocessor, the
    # extra programs repeating earlier tiles and storing nothing (``whole_wave_programs``).
    # Each GEMM then leaves the same free room on every multiprocessor for the next one's
    # programs, launched early by PDL; with idle multiprocessors two of them land on each
    # and set its end (the chunked tile at 128 programs gains nothing from the early
    # trigger, at 132 it gains 0.8-1.4 us). ``chunked_one_row_config`` sets it where it
    # pads.
    whole_wave: bool = False
    # With k_chunks and paired steps, chunks of exactly 4 steps: steps 1-3 load right
    # after the wait for the kernel before, each into registers of its own (step 0 before
    # it), then the 4 steps run (``_four_steps_up_front``). In the paired loop the next
    # step's loads can only follow the MMAs that read the registers they refill, so a
    # step is issued one step ahead and each pair of steps waits out a memory round trip;
    # here all four are in flight at once. Needs a register cap (``max_registers``):
    # left to itself ptxas takes 84 registers by moving each load next to its first use
    # (4096 x 6144: 6.3 against 7.1 us at a cap of 120, bench/results/quant.md).
    steps_up_front: bool = False


def pick_mma_config(m: int, n: int, k: int, group_size: int, num_sms: int = 132) -> MmaConfig:
    """Tiles by rows of x, the fastest of their sweeps and A/Bs (bench/results/quant.md).
    Steps of 128 rows of K (or of the group when it is shorter), 16 rows of x per
    program; x, scales and zero points a load ahead at M = 1 and with two steps a load;
    at M = 1 steps in pairs.

    M = 1: K summed in each program where its programs fill one wave
    (``chunked_one_row_config``), else ``split_one_row_config``: wide layers (N >= 8192)
    64 columns on 2 warps; deep ones (K >= 8192) 256 columns on 8 warps; else 128
    columns on 4 warps; K split as far as one wave of programs allows
    (``one_wave_split``), 16 splits summed by the last split; on deep layers zero points
    by sums of x. 2..8 rows: 128 columns on 8 warps split 8 ways (a load ahead on deep
    layers); 9..16 rows: 64 columns on 2 warps, two steps per load, split 4 ways (8 when
    K >= 8192); wide layers (2..16 rows) 64 columns on 2 warps split 2 ways. 17..32 rows:
    64 columns on 2 warps split 4 ways (unsplit on wide layers), or 128 on 4 warps split
    8 ways when K >= 8192."""
    block_k = step_rows(k, group_size)
    if m == 1:
        return (chunked_one_row_config(n, k, group_size, num_sms)
                or split_one_row_config(n, k, group_size, num_sms))
    if m > 16:  # 17..32 rows, as two 16-row blocks
        if n >= 8192:
            return MmaConfig(64, block_k, 1, 2, vector_columns=False)
        if k >= 8192:
            return MmaConfig(128, block_k, 8, 4, vector_columns=False)
        return MmaConfig(64, block_k, 4, 2, vector_columns=False)
    if n >= 8192:
        return MmaConfig(64, block_k, 2, 2, vector_columns=False)
    if m > 8:  # 9..16 rows: 64 columns on 2 warps, two steps per load
        return MmaConfig(64, block_k, 8 if k >= 8192 else 4, 2, load_steps=2,
                         vector_columns=False, params_ahead=True)
    # 2..8 rows: x, scales and zero points a load ahead on deep layers only (14336 x 4096:
    # 19.1-20.0 against 20.3-21.3 us; slower on the 4096-deep layers).
    return MmaConfig(128, block_k, 8, 8, vector_columns=False, params_ahead=k >= 8192)


def split_one_row_config(n: int, k: int, group_size: int, num_sms: int = 132) -> MmaConfig:
    """The one-row tile that splits K over programs summed through global partials
    (``pick_mma_config``'s M = 1 tiles where ``chunked_one_row_config`` declines)."""
    block_k = step_rows(k, group_size)
    block_n, warps = (64, 2) if n >= 8192 else (256, 8) if k >= 8192 else (128, 4)
    split = one_wave_split(-(-n // block_n), warps, k, block_k, num_sms)
    return MmaConfig(block_n, block_k, split, warps, params_ahead=True,
                     paired_steps=True, last_split_reduces=split >= 16,
                     zeros_by_x_sums=k >= 8192)


_CHUNKED_COLUMNS, _CHUNKS = 32, 8
# ptxas's cap for ``steps_up_front``: two programs of 8 warps a multiprocessor fit under
# 128, and 120 ran 4096 x 6144 / 4096 x 4096 0.1 us faster still.
_UP_FRONT_REGISTERS = 120


def chunked_one_row_config(n: int, k: int, group_size: int,
                           num_sms: int = 132) -> MmaConfig | None:
    """The one-row tile that sums K inside each program (32 columns x 8 chunks of K on
    8 warps, ``MmaConfig.k_chunks``) where its programs fill every multiprocessor in one
    wave on a narrow layer (N, K < 8192) whose eighths of K are whole steps and groups;
    None elsewhere. One wave: more programs than multiprocessors, at most the two a
    multiprocessor holds at 128 registers; or at least 7/8 of one a multiprocessor, the
    grid then padded to one each (``whole_wave``).

    Against the split tile (bench/results/quant.md): 4096 x 6144 (192 programs) 7.0 against
    7.5-7.9 us, 4096 x 4096 (128 programs, padded) 5.3-5.4 against 5.8-5.9, faster
    still with chunks of 4 steps loaded up front (``MmaConfig.steps_up_front``: 6.3 and
    4.8 us); slower on the wide and deep layers (29.3 against 23.7 us on 4096 x 28672,
    16.3 against 13.1 on 14336 x 4096)."""
    block_k = step_rows(k, group_size)
    config = MmaConfig(_CHUNKED_COLUMNS, block_k, 1, 8, params_ahead=True,
                       paired_steps=True, k_chunks=_CHUNKS)
    programs = -(-n // _CHUNKED_COLUMNS)
    if n >= 8192 or k >= 8192 or chunks_not_whole(config, k, group_size, k):
        return None
    if chunks_of_four_steps(config, k):
        config = replace(config, steps_up_front=True, max_registers=_UP_FRONT_REGISTERS)
    if num_sms < programs <= 2 * num_sms:
        return config
    if 8 * programs >= 7 * num_sms and programs <= num_sms:
        return replace(config, whole_wave=True)
    return None


def whole_wave_programs(config: MmaConfig, blocks: int, num_sms: int) -> int:
    """Programs along N of a launch with ``blocks`` column blocks: with
    ``MmaConfig.whole_wave`` (``k_chunks`` tiles only: one program a column block) the
    next multiple of ``num_sms``, else ``blocks``."""
    if not config.whole_wave:
        return blocks
    if not config.k_chunks:
        raise ValueError("MmaConfig.whole_wave pads the grid of k_chunks tiles only; "
                         f"got k_chunks={config.k_chunks}")
    return -(-blocks // num_sms) * num_sms


def one_wave_split(blocks: int, num_warps: int, k: int, block_k: int, num_sms: int) -> int:
    """Ways to split K (a power of two, at most 16) for ``blocks`` column blocks: the most
    that keeps every program resident at once (the one-row tiles build to 128 registers
    a thread, so 16 / num_warps programs a multiprocessor) with at least two steps a
    split. A second wave would start the last splits late, and they sum the tile."""
    resident = num_sms * (16 // num_warps)
    split = 1
    while split < 16 and blocks * split * 2 <= resident and k // (block_k * split * 2) >= 2:
        split *= 2
    return split


def chunk_rows(config: MmaConfig, k_split: int) -> int:
    """Rows of K a program's tile walks: its split's, or with ``k_chunks`` one chunk's."""
    return k_split // max(config.k_chunks, 1)


def tile_rows(config: MmaConfig) -> int:
    """Rows of a program's weight tile (the MMA's A operand): its output columns, times
    the chunks of K with ``k_chunks``."""
    return config.block_n * max(config.k_chunks, 1)


def runs_paired(config: MmaConfig) -> bool:
    """``paired_steps`` where it applies: x, scales and zero points a load ahead, one step
    a load, x from global memory."""
    return config.paired_steps and config.load_steps == 1 and config.params_ahead


def chunks_of_four_steps(config: MmaConfig, k_split: int) -> bool:
    """Whether a split of k_split rows parts into ``k_chunks`` chunks of exactly 4 steps
    (``steps_up_front``'s tile)."""
    return chunk_rows(config, k_split) == 4 * config.block_k


def chunks_not_whole(config: MmaConfig, k_split: int, group_size: int, k: int) -> bool:
    """Whether a split of k_split rows fails to part into ``k_chunks`` chunks of whole
    loads lying on group boundaries (one group for all of K needs none)."""
    chunk = chunk_rows(config, k_split)
    return bool(k_split % config.k_chunks or chunk % (config.block_k * config.load_steps)
                or (group_size < k and chunk % group_size))
