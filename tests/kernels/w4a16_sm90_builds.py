"""The W4A16 Gluon kernels built for sm_90 as their launchers would launch them (for the
sm_90 build tests): each returns ``sm90_build``'s ``Build`` (SASS, registers, stack
bytes), with the installed Triton."""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from sm90_build import Build, compile_sm90  # noqa: E402

from tamis.kernels import w4a16_mma, w4a16_wgmma, w4a16_wgmma_tma  # noqa: E402
from tamis.kernels.splitk import even_split  # noqa: E402


SIGNATURE = {"x_ptr": "*bf16", "qw_ptr": "*i32", "s_ptr": "*fp16", "z_ptr": "*fp16",
             "out_ptr": "*bf16", "part_ptr": "*fp32", "count_ptr": "*i32", "M": "i32",
             "N": "i32", "K": "i32", "K_SPLIT": "i32", "SPLIT": "i32", "stride_xm": "i32",
             "stride_qk": "i32", "stride_sg": "i32", "stride_om": "i32"}


def wgmma_build(block_m, block_n, block_k, warps, stages, split, even, pairs,
                params_ahead=2, pdl_trigger=None) -> Build:
    """The cp.async wgmma kernel for a tile (K split 2 ways when ``split``)."""
    config = w4a16_wgmma.WgmmaConfig(block_n, block_k, 2 if split else 1, warps, stages,
                                     pairs, params_ahead)
    pdl = pdl_trigger is not None
    constexprs = w4a16_wgmma.wgmma_constexprs(config, block_m, 128, config.split_k, even,
                                              pdl_wait=pdl, pdl_trigger=pdl_trigger or 0)
    return compile_sm90(w4a16_wgmma._w4_wgmma_kernel, SIGNATURE, constexprs, warps,
                        launch_pdl=pdl)


def mma_build(block_m, config, pdl_trigger=None, k=4096, m=1, real_blocks=0) -> Build:
    """The MMA kernel as ``w4a16_gemm_mma`` launches it for a K of k (even splits;
    ``real_blocks``: the column blocks of a padded grid, ``MmaConfig.whole_wave``)."""
    pdl = pdl_trigger is not None
    splits, k_split = even_split(k, config.block_k * config.load_steps, config.split_k)
    constexprs = w4a16_mma.mma_constexprs(config, block_m, 128, splits, True,
                                          pdl_wait=pdl, pdl_trigger=pdl_trigger or 0,
                                          k_split=k_split, m=m, real_blocks=real_blocks)
    return compile_sm90(w4a16_mma._w4_mma_kernel, SIGNATURE, constexprs, config.num_warps,
                        launch_pdl=pdl, **w4a16_mma.mma_compile_options(constexprs,
                                                                        config.max_registers))


def tma_build(block_m, config, pdl_trigger=None, rows=None) -> Build:
    """The TMA wgmma kernel as launched for ``config`` on x of ``rows`` rows (default
    ``block_m``) in blocks of ``block_m`` (K split)."""
    from triton.runtime.jit import mangle_type
    x = torch.zeros(rows or block_m, 4096, dtype=torch.bfloat16)
    packed = torch.zeros(512, 4096, dtype=torch.int32)
    x_desc, w_desc = w4a16_wgmma_tma.descriptors(x, packed, config, block_m)
    signature = {**SIGNATURE, "x_desc": mangle_type(x_desc), "w_desc": mangle_type(w_desc)}
    pdl = pdl_trigger is not None
    constexprs = w4a16_wgmma_tma.tma_constexprs(config, block_m, 128, config.split_k,
                                                pdl_wait=pdl, pdl_trigger=pdl_trigger or 0)
    options = w4a16_wgmma_tma.compile_options(config)
    return compile_sm90(w4a16_wgmma_tma._w4_wgmma_tma_kernel, signature, constexprs,
                        options.pop("num_warps"), launch_pdl=pdl, **options)
