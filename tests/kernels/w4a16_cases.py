"""Random 4-bit weights and the reference check shared by the MMA-fragment and wgmma
W4A16 kernel tests (imported by the test modules)."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from tamis.kernels import w4a16
from tamis.quant.packing import pack_int32


# (K, N, group size): a real layer, N not a multiple of the tiles, one group over all of
# K, 32-row groups, and groups that do not divide K (ceil(K / G) groups).
KERNEL_SHAPES = [(4096, 4096, 128), (576, 300, 64), (1024, 520, 1024), (576, 136, 32),
                 (576, 200, 128)]


def wna16_operands(k: int, n: int, group_size: int, seed: int):
    """(codes [K, N], canonical words, fp16 scales, integer zero points in [0, 16])."""
    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (k, n), generator=gen)
    groups = -(-k // group_size)
    scales = (torch.rand(groups, n, generator=gen) * 0.02 + 0.001).half()
    zeros = torch.randint(0, 17, (groups, n), generator=gen).half()
    return codes, pack_int32(codes, 4, dim=0), scales, zeros


def assert_matches_reference(got: torch.Tensor, x: torch.Tensor, qweight: torch.Tensor,
                             scales: torch.Tensor, zeros: torch.Tensor, group_size: int):
    """got (bf16, any device) against the fp32 reference within bf16 tolerance."""
    expected = w4a16.w4a16_gemm_ref(x.float(), qweight, scales.float(), zeros.float(),
                                    group_size)
    assert got.dtype == torch.bfloat16 and got.shape == expected.shape
    tol = 1e-2 * expected.abs().max().item()
    torch.testing.assert_close(got.float().cpu(), expected, rtol=1e-2, atol=tol)


def hopper() -> bool:
    """A Hopper GPU is present (wgmma and the TMA are sm_90)."""
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


def assert_refused(gemm, x: torch.Tensor, config, match: str, group_size: int):
    """``gemm(x, words, scales, zeros, group_size, config)`` on a 64-column layer raises
    ValueError naming ``match``, before anything is launched (x may be on the CPU)."""
    k = x.shape[1]
    packed = torch.zeros(k // 8, 64, dtype=torch.int32)
    scales, zeros = torch.ones(k // group_size, 64), torch.zeros(k // group_size, 64)
    with pytest.raises(ValueError, match=match):
        gemm(x, packed, scales, zeros, group_size, config)


def assert_sums_agree(gemm, args: tuple, at_arrival, launches: int = 10) -> torch.Tensor:
    """``gemm(*args, config)`` summing split K by arrival (``at_arrival``), at the last
    split (the same config, ``last_split_reduces``) and, where the config has it, there
    through partials in thread order (``linear_partials``), ``launches`` times each back
    to back (each must leave its counters at zero for the next): every output bit-equal,
    the sums adding the same partials in the same order. Returns the last output."""
    configs = [at_arrival, replace(at_arrival, last_split_reduces=True)]
    if hasattr(at_arrival, "linear_partials"):
        configs.append(replace(configs[1], linear_partials=True))
    outs = [gemm(*args, cfg) for cfg in configs for _ in range(launches)]
    assert all(torch.equal(out, outs[0]) for out in outs)
    return outs[-1]
