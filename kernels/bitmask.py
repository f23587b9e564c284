"""Constraint bitmask applied to logits, in place.

``bitmask`` is int32 ``[rows, ceil(V / 32)]``; bit ``j`` of word ``w`` (little-endian,
``(word >> j) & 1``) is token ``32 * w + j``; a set bit means "allowed". Disallowed
logits become ``-inf``. Logits wider than the mask (a model vocabulary padded past the
tokenizer's) have their tail masked: a token the mask does not cover is disallowed.

``indices`` (optional) lists the rows to touch; row ``i`` of the logits is masked by row
``i`` of the bitmask (xgrammar's convention), other rows are left alone.
"""
from __future__ import annotations

import numpy as np
import torch

from tamis.kernels._triton import kernel, next_power_of_2, use_triton

try:
    import triton
    import triton.language as tl
except ImportError:  # the reference path needs no Triton
    triton = tl = None


def _check(logits: torch.Tensor, bitmask: torch.Tensor,
           indices: torch.Tensor | list[int] | None) -> torch.Tensor | None:
    if logits.dim() != 2 or not logits.is_floating_point():
        raise ValueError(f"logits must be a 2-D float tensor [rows, vocab], got "
                         f"{tuple(logits.shape)} {logits.dtype}")
    if bitmask.dim() != 2 or bitmask.dtype != torch.int32:
        raise ValueError(f"bitmask must be a 2-D int32 tensor [rows, ceil(vocab/32)], got "
                         f"{tuple(bitmask.shape)} {bitmask.dtype}")
    if bitmask.shape[0] != logits.shape[0]:
        raise ValueError(f"bitmask has {bitmask.shape[0]} rows but logits have "
                         f"{logits.shape[0]}: row i of the mask applies to row i of the logits")
    if bitmask.device != logits.device:
        raise ValueError(f"bitmask is on {bitmask.device} but logits are on {logits.device}")
    if logits.stride(-1) != 1 or bitmask.stride(-1) != 1:
        raise ValueError("logits and bitmask rows must be contiguous: use .contiguous()")
    if indices is None:
        return None
    indices = torch.as_tensor(indices, dtype=torch.int64).to(logits.device)
    if indices.dim() != 1:
        raise ValueError(f"indices must be 1-D, got shape {tuple(indices.shape)}")
    if indices.numel() and (int(indices.min()) < 0 or int(indices.max()) >= logits.shape[0]):
        raise ValueError(f"indices must lie in [0, {logits.shape[0]}), got {indices.tolist()}")
    return indices


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """bool ``[rows, vocab_size]``, True = allowed; tokens past the mask are False."""
    shifts = torch.arange(32, device=bitmask.device, dtype=torch.int32)
    allowed = ((bitmask.unsqueeze(-1) >> shifts) & 1).bool().flatten(-2)
    if allowed.shape[-1] >= vocab_size:
        return allowed[:, :vocab_size]
    tail = allowed.new_zeros(allowed.shape[0], vocab_size - allowed.shape[-1])
    return torch.cat([allowed, tail], dim=-1)


def apply_token_bitmask_ref(logits: torch.Tensor, bitmask: torch.Tensor,
                            indices: torch.Tensor | list[int] | None = None) -> torch.Tensor:
    """Plain-torch reference; returns ``logits`` (modified in place)."""
    rows = _check(logits, bitmask, indices)
    allowed = unpack_bitmask(bitmask, logits.shape[-1])
    if rows is None:
        logits.masked_fill_(~allowed, float("-inf"))
    else:
        logits[rows] = logits[rows].masked_fill(~allowed[rows], float("-inf"))
    return logits


if tl is not None:
    @kernel
    def _bitmask_kernel(logits_ptr, bitmask_ptr, rows_ptr, vocab_size, mask_words,
                        logits_stride, bitmask_stride,
                        HAS_ROWS: tl.constexpr, BLOCK: tl.constexpr):
        pid_row = tl.program_id(0)
        pid_col = tl.program_id(1)
        if HAS_ROWS:
            row = tl.load(rows_ptr + pid_row).to(tl.int64)
        else:
            row = pid_row.to(tl.int64)
        cols = pid_col * BLOCK + tl.arange(0, BLOCK)
        in_vocab = cols < vocab_size
        words = tl.load(bitmask_ptr + row * bitmask_stride + cols // 32,
                        mask=in_vocab & (cols // 32 < mask_words), other=0)
        allowed = ((words >> (cols % 32)) & 1) != 0
        # Store only the disallowed entries: allowed logits are never rewritten.
        tl.store(logits_ptr + row * logits_stride + cols,
                 tl.full([BLOCK], float("-inf"), tl.float32).to(logits_ptr.dtype.element_ty),
                 mask=in_vocab & ~allowed)


def apply_token_bitmask_triton(logits: torch.Tensor, bitmask: torch.Tensor,
                               indices: torch.Tensor | list[int] | None = None) -> torch.Tensor:
    """The Triton kernel (compiled on CUDA, interpreted on CPU); returns ``logits``."""
    rows = _check(logits, bitmask, indices)
    num_rows = logits.shape[0] if rows is None else rows.numel()
    vocab_size = logits.shape[-1]
    if num_rows == 0 or vocab_size == 0:
        return logits
    block = min(4096, next_power_of_2(vocab_size))
    grid = (num_rows, triton.cdiv(vocab_size, block))
    _bitmask_kernel[grid](logits, bitmask, rows if rows is not None else bitmask,
                          vocab_size, bitmask.shape[-1], logits.stride(0), bitmask.stride(0),
                          HAS_ROWS=rows is not None, BLOCK=block)
    return logits


_NEG_INF_BITS = int(np.array(-np.inf, dtype=np.float32).view(np.int32))


def apply_token_bitmask_cpu(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """CPU path of ``apply_token_bitmask_ref`` for contiguous float32 logits and all rows:
    the same result, 3-4x faster at [32, 49152] (masked_fill's per-element branch on a
    random mask dominated the reference). Each allowed bit becomes an int32 word of all
    ones, a disallowed one zero; the logits' bits are ANDed with it and ORed with -inf's
    bits where it is zero: four branch-free vector passes."""
    _check(logits, bitmask, None)
    vocab = logits.shape[-1]
    words = bitmask.contiguous().numpy()
    bits = np.unpackbits(words.view(np.uint8), axis=-1, count=min(vocab, 32 * words.shape[-1]),
                         bitorder="little")
    keep = np.zeros(logits.shape, dtype=np.int32)
    np.negative(bits, out=keep[:, :bits.shape[-1]], dtype=np.int32)   # 1 -> -1 (all ones)
    x = logits.numpy().view(np.int32)
    np.bitwise_and(x, keep, out=x)
    np.invert(keep, out=keep)
    np.bitwise_and(keep, _NEG_INF_BITS, out=keep)
    np.bitwise_or(x, keep, out=x)
    return logits


def apply_token_bitmask_(logits: torch.Tensor, bitmask: torch.Tensor,
                         indices: torch.Tensor | list[int] | None = None) -> torch.Tensor:
    """Sets disallowed logits to -inf in place (Triton on CUDA; on CPU the branch-free
    numpy path for float32 logits, the reference otherwise)."""
    if use_triton(logits):
        return apply_token_bitmask_triton(logits, bitmask, indices)
    if (indices is None and logits.device.type == "cpu" and bitmask.device.type == "cpu"
            and logits.dtype == torch.float32 and logits.dim() == 2 and logits.is_contiguous()
            and bitmask.dtype == torch.int32):
        return apply_token_bitmask_cpu(logits, bitmask)
    return apply_token_bitmask_ref(logits, bitmask, indices)
