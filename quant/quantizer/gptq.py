"""GPTQ (Frantar et al., 2022): quantize one input column at a time and spread its
rounding error over the columns not yet quantized, weighted by the inverse Hessian of the
layer's inputs (H = 2/n sum x x^T), in blocks of ``block_size`` columns (lazy batch updates).

``gptq_solve`` is the error-feedback loop over any column rounding (the 4/8-bit integer
grids of ``gptq_quantize``, or the FP8 grid of ``gptq_fp8``). With ``act_order`` columns
are visited in decreasing order of H's diagonal; groups are formed in that visiting order,
so ``g_idx`` maps each original column to its group and groups are no longer contiguous
in K (what GPTQ checkpoints call ``desc_act``).

Everything runs on the device of the weight and Hessian given (CPU or CUDA); the results
are on that device too.
"""
from __future__ import annotations

import contextlib
from typing import Callable

import torch

from tamis.quant.quantizer.grid import QuantizedWeight, fit_grid

# round_column(position, column, pending) -> dequantized column [N]: ``column`` [N] is the
# error-updated column at ``position``; ``pending()`` [N, K - position] builds (on demand:
# it copies) the error-updated weights of every column not yet quantized, in visiting order.
RoundColumn = Callable[[int, torch.Tensor, Callable[[], torch.Tensor]], torch.Tensor]


# The dtype of GPTQ's Hessians, weights and error updates, as in GPTQ's reference code and
# llm-compressor. In float64 the x^T x products alone took a fifth of a SmolLM2 run and the
# per-column updates another quarter (cProfile, 16 x 128 calibration); the damped Hessian's
# float32 Cholesky factor is accurate enough for rounding decisions.
SOLVE_DTYPE = torch.float32


class HessianAccumulator:
    """Running H = 2/n sum x x^T (float32 [K, K], on ``device``) over the rows of every
    batch seen."""

    def __init__(self, in_features: int, device: torch.device | str = "cpu"):
        self.hessian = torch.zeros(in_features, in_features, dtype=SOLVE_DTYPE, device=device)
        self.count = 0

    def add(self, x: torch.Tensor) -> None:
        x = x.reshape(-1, x.shape[-1]).to(SOLVE_DTYPE)
        total = self.count + x.shape[0]
        # One GEMM that also rescales the running mean in place.
        self.hessian.addmm_(x.t(), x, beta=self.count / total, alpha=2.0 / total)
        self.count = total


def visiting_order(hessian: torch.Tensor, act_order: bool, block: int = 1) -> torch.Tensor:
    """The order GPTQ visits the K columns in: K order, or (``act_order``) decreasing
    Hessian diagonal. ``block`` > 1 orders runs of ``block`` contiguous columns (the last
    may be shorter) by their summed diagonal instead, each run kept together and visited
    by decreasing diagonal within: with dynamic groups a group is then a union of whole
    runs (``block`` dividing the group size)."""
    k = hessian.shape[0]
    diagonal = torch.diag(hessian)
    if not act_order:
        return torch.arange(k, device=hessian.device)
    if block == 1:
        return torch.argsort(diagonal, descending=True)
    run = torch.arange(k, device=hessian.device) // block
    score = torch.zeros(int(run[-1]) + 1, dtype=diagonal.dtype,
                        device=hessian.device).index_add_(0, run, diagonal)
    # Sort by run (heaviest first), then by diagonal within a run: one stable sort per key.
    within = torch.argsort(diagonal, descending=True, stable=True)
    rank = torch.argsort(torch.argsort(score, descending=True, stable=True))
    return within[torch.argsort(rank[run[within]], stable=True)]


@contextlib.contextmanager
def one_thread():
    """torch on one CPU thread inside the block. The column loop issues a few small ops
    per column of K: split over threads each waits for the slowest, and on a machine
    whose cores are shared the solve ran several times slower on two threads than on
    one (e.g. 0.4-15 s against 0.2-0.3 s for a 3072 x 576 weight)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def gptq_solve(weight: torch.Tensor, hessian: torch.Tensor, perm: torch.Tensor,
               round_column: RoundColumn, damp: float = 0.01, block_size: int = 128) -> None:
    """Visits the columns of ``weight`` [N, K] in the order ``perm``, calling
    ``round_column`` for each (which records the rounded column); returns nothing.
    Runs on one CPU thread (``one_thread``)."""
    with one_thread():
        _solve(weight, hessian, perm, round_column, damp, block_size)


def _solve(weight: torch.Tensor, hessian: torch.Tensor, perm: torch.Tensor,
           round_column: RoundColumn, damp: float, block_size: int) -> None:
    w = weight.detach().to(SOLVE_DTYPE).clone()
    h = hessian.to(SOLVE_DTYPE).clone()
    k = w.shape[1]
    dead = torch.diag(h) == 0
    h[dead, dead] = 1.0
    w[:, dead] = 0.0
    # Transposed, [K, N] in visiting order: the column each step reads, rounds and updates
    # is one contiguous vector, not N values a row apart.
    columns, h = w[:, perm].t().contiguous(), h[perm][:, perm]
    h += damp * torch.mean(torch.diag(h)) * torch.eye(k, dtype=h.dtype, device=h.device)
    hinv = inverse_cholesky_upper(h)
    diagonal = torch.diag(hinv).tolist()
    for start in range(0, k, block_size):
        end = min(start + block_size, k)
        block = columns[start:end].clone()
        errors = torch.empty_like(block)
        for i in range(end - start):
            pending = lambda i=i: torch.cat([block[i:], columns[end:]]).t()  # noqa: E731
            dq = round_column(start + i, block[i], pending).to(SOLVE_DTYPE)
            err = torch.sub(block[i], dq, out=errors[i]).div_(diagonal[start + i])
            # One fused outer-product update: this loop runs once per column of K, and
            # on a CPU its small ops cost more in dispatch than in arithmetic.
            block[i:].addr_(hinv[start + i, start + i:end], err, alpha=-1)
        columns[end:].addmm_(hinv[start:end, end:].t(), errors, alpha=-1)


def inverse_cholesky_upper(h: torch.Tensor) -> torch.Tensor:
    """U upper triangular with H^-1 = U^T U (GPTQ's ``cholesky(cholesky_inverse(
    cholesky(H)), upper=True)``), from one Cholesky factorization and one triangular
    solve instead of two factorizations and an inverse. With J the reversal of the
    indices, J H J = M M^T (M lower) gives U = J M^-1 J."""
    m = torch.linalg.cholesky(h.flip(0, 1))
    eye = torch.eye(h.shape[0], dtype=h.dtype, device=h.device)
    return torch.linalg.solve_triangular(m, eye, upper=False).flip(0, 1)


def gptq_quantize(weight: torch.Tensor, hessian: torch.Tensor, bits: int, group_size: int,
                  sym: bool, act_order: bool, damp: float = 0.01, block_size: int = 128,
                  min_zero: int = 0, search: bool = True, weighted_clip: bool = False,
                  static_groups: bool = False, act_order_block: int = 1,
                  grids: tuple[torch.Tensor, torch.Tensor] | None = None,
                  prefit: bool = False) -> QuantizedWeight:
    """weight [N, K] float; hessian [K, K]. Returns codes in the original column order.
    Each group's grid is fitted (``fit_grid``, clipping search unless ``search`` is
    False) on its error-updated weights when the solve reaches the group's first column.
    ``weighted_clip``: the clipping search minimizes the group's output error under its
    block of ``hessian`` instead of the plain squared weight error. ``static_groups``
    (act-order only): groups stay contiguous in K and their grids are fitted on the
    original weights before the solve (``g_idx`` = column // group). ``grids``: the
    (scales, zeros) [N, G] of a previous call with the same arguments, held fixed (no
    fitting; the same groups, hence the same ``g_idx``). ``act_order_block``: act order
    over runs of that many contiguous columns (``visiting_order``). ``prefit`` (dynamic
    groups): each group's grid is fitted before the solve on the original weights of its
    columns, as static groups do, instead of on the error-updated ones."""
    n, k = weight.shape
    perm = visiting_order(hessian, act_order, act_order_block)
    group = k if group_size == -1 else group_size
    groups = -(-k // group)
    device = weight.device
    # Row p: the codes of the p-th visited column.
    codes = torch.empty(k, n, dtype=torch.int32, device=device)
    scales, zeros = torch.empty(n, groups, device=device), torch.empty(n, groups, device=device)
    h_perm = hessian[perm][:, perm] if weighted_clip else None
    static = static_groups and act_order
    fixed = static or prefit or grids is not None  # every grid known before the solve
    if grids is not None:
        scales, zeros = grids[0].clone(), grids[1].clone()
    elif static or prefit:
        for g in range(groups):
            # Static: the contiguous columns of group g; prefit: those visited g-th.
            cols = torch.arange(g * group, min((g + 1) * group, k), device=device)
            cols = cols if static else perm[cols]
            block = hessian[cols][:, cols] if weighted_clip else None
            scales[:, g], zeros[:, g] = fit_grid(weight[:, cols], bits, sym, min_zero,
                                                 search=search, hessian=block)
    # Per visited position: its group, and (fixed grids) the group's grid as contiguous rows.
    group_at = ((perm if static else torch.arange(k, device=device)) // group).tolist()
    grid = {"scales": scales.t().contiguous(), "zeros": zeros.t().contiguous()} if fixed else {}
    maxq = 2**bits - 1

    def round_column(position: int, column: torch.Tensor, pending) -> torch.Tensor:
        g = group_at[position]
        if fixed:
            scale, zero = grid["scales"][g], grid["zeros"][g]
        else:
            if position % group == 0:
                cols = slice(position, position + group)
                block = h_perm[cols, cols] if weighted_clip else None
                grid["scale"], grid["zero"] = fit_grid(pending()[:, :group], bits, sym,
                                                       min_zero, search=search, hessian=block)
                scales[:, g], zeros[:, g] = grid["scale"], grid["zero"]
            scale, zero = grid["scale"], grid["zero"]
        # quantize_codes, in place on one column (this runs once per column of K).
        q = torch.round(column / scale).add_(zero).clamp_(0, maxq)
        codes[position] = q
        return q.sub_(zero).mul_(scale)

    gptq_solve(weight, hessian, perm, round_column, damp, block_size)
    inverse = torch.argsort(perm)
    if static:
        g_idx = (torch.arange(k, device=device) // group).to(torch.int32)
    else:
        g_idx = (inverse // group).to(torch.int32)  # column c was visited at position inverse[c]
    return QuantizedWeight(codes[inverse].t().contiguous(), scales, zeros, g_idx, bits,
                           group_size)
