"""Tile bookkeeping shared by the fused-MoE grouped GEMMs (``fused_moe.py``,
``fused_moe_wna16.py``, ``fused_moe_fp8_block.py``): which (M block, N block) a program
computes, and which routed rows its M block holds (the layout ``moe_align`` sorts them into).

Plain ``@triton.jit`` helpers: the compiler inlines them into a compiled kernel, and an
interpreted launch (``tamis.kernels._triton``) interprets them with the kernel.
"""
from __future__ import annotations

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: the references only
    triton = tl = None


if tl is not None:
    @triton.jit
    def moe_tile(pid, N, num_blocks_m, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
        """(M block, N block) of program ``pid``: GROUP_M M blocks side by side per N
        column, so the programs running together read the same expert weight tiles."""
        blocks_n = tl.cdiv(N, BLOCK_N)
        group_size = GROUP_M * blocks_n
        first_m = (pid // group_size) * GROUP_M
        rows_in_group = tl.minimum(num_blocks_m - first_m, GROUP_M)
        return first_m + (pid % group_size) % rows_in_group, (pid % group_size) // rows_in_group

    @triton.jit
    def moe_block_rows(sorted_ids_ptr, expert_ids_ptr, pid_m, num_pairs,
                       A_ROWS_PER_PAIR: tl.constexpr, BLOCK_M: tl.constexpr):
        """The M block's (token, expert) pairs, which of them are real (not padding), the
        block's expert, and the rows of the activations the pairs read."""
        pair = tl.load(sorted_ids_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
        expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
        return pair, pair < num_pairs, expert, (pair // A_ROWS_PER_PAIR).to(tl.int64)
else:
    moe_tile = moe_block_rows = None   # the kernels that call them are not defined either
