"""`tamis quantize`'s newer options: stacked GPTQ solves equal separate ones, the
output-error clip search minimizes the output error, the scale refit and the coordinate
descent never raise it, static groups keep a plain checkpoint, and every option still
writes a checkpoint whose reload matches the quantizer (round trip)."""
from __future__ import annotations

import pytest
import torch

from tamis.quant.quantizer.awq import search_scales
from tamis.quant.quantizer.descent import descend_codes
from tamis.quant.quantizer.gptq import gptq_quantize, visiting_order
from tamis.quant.quantizer.grid import (SHRINK_FACTORS, _grid_for_range, fit_grid,
                                        quantize_codes, rtn_quantize)
from tamis.quant.quantizer.pipeline import QuantizeOptions, _split_rows
from tamis.quant.quantizer.refit import refit_scales

from test_roundtrip import _round_trip, one_layer, samples, tiny  # noqa: F401  (fixtures)

torch.manual_seed(0)


def _correlated_hessian(k: int, tokens: int = 512) -> torch.Tensor:
    x = torch.randn(tokens, 8) @ torch.randn(8, k) + 0.1 * torch.randn(tokens, k)
    return (x.t() @ x).double()


def test_stacked_gptq_solve_equals_separate_solves():
    """Rows are independent in GPTQ: one solve over q/k/v stacked = three solves."""
    h = _correlated_hessian(64)
    weights = [torch.randn(n, 64) for n in (32, 16, 16)]
    stacked = _split_rows(gptq_quantize(torch.cat(weights), h, 4, 32, True, True), [32, 16, 16])
    for w, part in zip(weights, stacked):
        alone = gptq_quantize(w, h, 4, 32, True, True)
        assert torch.equal(part.codes, alone.codes)
        assert torch.equal(part.scales, alone.scales) and torch.equal(part.g_idx, alone.g_idx)
    assert part.g_idx.data_ptr() != stacked[0].g_idx.data_ptr()  # writable by safetensors


def _output_error(w, qw, h):
    e = (qw.dequantize() - w).double()
    return ((e @ h) * e).sum().item()


def test_output_error_clip_beats_diagonal_clip_on_output_error():
    h = _correlated_hessian(128)
    w = torch.randn(64, 128)
    w[:, :4] *= 6
    diag = rtn_quantize(w, 4, 64, sym=False, importance=torch.diag(h).float())
    full = rtn_quantize(w, 4, 64, sym=False, hessian=h)
    assert _output_error(w, full, h) < 0.97 * _output_error(w, diag, h)
    scale, zero = fit_grid(w[:, :64], 4, False, hessian=h[:64, :64])
    assert torch.equal(quantize_codes(w[:, :64], scale, zero, 4), full.codes[:, :64])


def test_asymmetric_search_shrinks_min_and_max_apart():
    """On rows with a one-sided tail the (lo, hi) pair search beats shrinking both ends by
    one factor on the loss it minimizes, and is never worse (it contains those grids)."""
    h = _correlated_hessian(64)[:64, :64].float()
    w = torch.randn(64, 64) * 0.1
    w[:, :2] = w[:, :2].abs() * 20  # long positive tail only
    losses = []
    for factor in SHRINK_FACTORS:  # the common-factor search alone
        scale, zero = _grid_for_range(w.amin(1) * factor, w.amax(1) * factor, 4, False, 0)
        e = (quantize_codes(w, scale, zero, 4) - zero[:, None]) * scale[:, None] - w
        losses.append(((e @ h) * e).sum(dim=1))
    common = torch.stack(losses).amin(dim=0)
    scale, zero = fit_grid(w, 4, False, hessian=h)
    e = (quantize_codes(w, scale, zero, 4) - zero[:, None]) * scale[:, None] - w
    paired = ((e @ h) * e).sum(dim=1)
    assert (paired <= common * (1 + 1e-5)).all()
    assert paired.sum() < 0.99 * common.sum()


def test_awq_defaults_to_gptq_rounding_with_static_groups():
    options = QuantizeOptions("awq", group_size=64)
    assert options.awq_gptq and options.static_groups and options.refine == 1
    rtn = QuantizeOptions("awq", group_size=64, awq_gptq=False)
    assert not rtn.static_groups and rtn.refine == 0
    with pytest.raises(ValueError, match="--awq-scales needs --method gptq"):
        QuantizeOptions("awq", awq_scales=True)


def test_calibrated_gptq_defaults_to_a_rotated_residual_stream():
    for options in (QuantizeOptions("gptq"), QuantizeOptions("gptq", sym=False, desc_act=True),
                    QuantizeOptions("gptq", bits=8)):
        assert options.rotate
    for options in (QuantizeOptions("gptq", rtn=True), QuantizeOptions("awq", group_size=64),
                    QuantizeOptions("fp8"), QuantizeOptions("gptq", rotate=False)):
        assert not options.rotate
    assert QuantizeOptions("fp8", rotate=True).rotate


def test_refit_defaults_to_refine_and_needs_an_integer_grid():
    assert QuantizeOptions("gptq").refit  # static groups: refine 1 ends with a refit
    dynamic = QuantizeOptions("gptq", desc_act=True, sym=False, act_order_block=1, refit=True)
    assert dynamic.refine == 0 and dynamic.refit
    with pytest.raises(ValueError, match="--refit needs"):
        QuantizeOptions("gptq", rtn=True, refit=True)
    with pytest.raises(ValueError, match="--refit needs"):
        QuantizeOptions("fp8", refit=True)


def test_no_clip_search_grids_cover_each_groups_min_max(monkeypatch):
    """--no-clip-search: each static group's symmetric grid spans its largest |w| (GPTQ's
    and llm-compressor's minmax grid, stored in float16), where the default search
    shrinks some; the option reaches the solve from QuantizeOptions and the CLI."""
    from tamis.cli import build_parser
    from tamis.quant.quantizer import pipeline
    w, h = torch.randn(16, 64), _correlated_hessian(64)
    plain = gptq_quantize(w, h, 4, 32, True, True, static_groups=True, search=False)
    for g in range(2):
        amax = w[:, 32 * g:32 * (g + 1)].abs().amax(dim=1)
        assert torch.equal(plain.scales[:, g], (2 * amax / 15).half().float())
    searched = gptq_quantize(w, h, 4, 32, True, True, static_groups=True)
    assert (searched.scales < plain.scales).any()

    seen = []
    real = pipeline.gptq_quantize
    monkeypatch.setattr(pipeline, "gptq_quantize",
                        lambda *a, **kw: seen.append(kw["search"]) or real(*a, **kw))
    for clip_search in (False, True):
        options = QuantizeOptions("gptq", clip_search=clip_search, refine=0)
        pipeline._gptq_linear(w, h, options)
    assert seen == [False, True]
    args = build_parser().parse_args(["quantize", "--method", "gptq", "--output", "o",
                                      "--no-clip-search"])
    assert args.clip_search is False


def test_static_groups_keep_contiguous_g_idx_with_act_order():
    h = _correlated_hessian(96)
    w = torch.randn(16, 96)
    qw = gptq_quantize(w, h, 4, 32, False, True, min_zero=1, static_groups=True)
    assert torch.equal(qw.g_idx.long(), torch.arange(96) // 32)
    dynamic = gptq_quantize(w, h, 4, 32, False, True, min_zero=1)
    assert not torch.equal(dynamic.g_idx.long(), torch.arange(96) // 32)


@pytest.mark.parametrize("sym,act_order,static", [(True, False, False), (False, True, False),
                                                    (True, True, True)])
def test_refit_and_descent_lower_the_output_error(sym, act_order, static):
    h = _correlated_hessian(96)
    w = torch.randn(32, 96)
    qw = gptq_quantize(w, h, 4, 32, sym, act_order, min_zero=0 if sym else 1,
                       weighted_clip=True, static_groups=static)
    refit = refit_scales(w, h, qw)
    assert torch.equal(refit.codes, qw.codes) and torch.equal(refit.zeros, qw.zeros)
    assert torch.equal(refit.scales, refit.scales.half().float())  # storable as written
    assert _output_error(w, refit, h) < 0.95 * _output_error(w, qw, h)
    descended = descend_codes(w, h, refit)
    assert torch.equal(descended.scales, refit.scales)
    assert _output_error(w, descended, h) <= _output_error(w, refit, h) * (1 + 1e-6)
    again = gptq_quantize(w, h, 4, 32, sym, act_order, min_zero=0 if sym else 1,
                          weighted_clip=True, static_groups=static,
                          grids=(refit.scales, refit.zeros))
    assert torch.equal(again.scales, refit.scales) and torch.equal(again.g_idx, qw.g_idx)


def test_static_groups_without_desc_act_write_a_plain_checkpoint(one_layer, samples, tmp_path):
    """The default GPTQ visits columns in act order but keeps g_idx = column // group and
    desc_act false: a checkpoint engines load as a plain (non act-order) one."""
    import json
    options = QuantizeOptions("gptq", group_size=32)
    assert options.static_groups and not options.desc_act
    result = _round_trip(one_layer, tmp_path, options, samples, layers=1)
    for quantized in result.weights.values():
        assert torch.equal(quantized.g_idx.long(), torch.arange(quantized.codes.shape[1]) // 32)
    config = json.loads((tmp_path / "out" / "config.json").read_text())["quantization_config"]
    assert config["desc_act"] is False and config["static_groups"] is True


def test_awq_scale_search_handles_a_partial_last_group():
    """K = 96 with group 64 (GPTQ's ceil(K / G) groups), symmetric grid."""
    s = search_scales(torch.randn(64, 96), [torch.randn(16, 96)], 4, 64, sym=True)
    assert s.shape == (96,) and bool(torch.isfinite(s).all()) and bool((s > 0).all())


@pytest.mark.parametrize("method,options", [
    ("gptq", dict(refine=2, descent=1, sym=False)),
    ("gptq", dict(desc_act=True, static_groups=True, refine=1)),
    ("gptq", dict(output_clip=False, static_groups=False, refine=0)),
    ("awq", dict(group_size=64, descent=1)),
    ("awq", dict(group_size=64, output_clip=False, refine=0)),
    ("gptq", dict(desc_act=True, true_sequential=True, output_clip=True)),
    ("gptq", dict(desc_act=True, sym=False, static_groups=True)),
    ("awq", dict(group_size=64, output_clip=True)),
    ("awq", dict(group_size=64, awq_gptq=True)),
    ("awq", dict(group_size=64, awq_gptq=True, static_groups=True, refine=1)),
    ("awq", dict(group_size=64, awq_gptq=False)),
    ("gptq", dict(desc_act=True, sym=False, awq_scales=True)),
    ("gptq", dict(desc_act=True, group_size=32, act_order_block=8)),
    ("gptq", dict(desc_act=True, sym=False, refit=True)),
    ("gptq", dict(desc_act=True, sym=False, group_size=32, act_order_block=8,
                  prefit_grids=True, refine=1)),
])
def test_new_options_round_trip(one_layer, samples, tmp_path, method, options):
    _round_trip(one_layer, tmp_path, QuantizeOptions(method, **options), samples, layers=1)


@pytest.mark.parametrize("sym,act_order,static,block,prefit", [
    (True, False, False, 1, False), (False, True, False, 1, False), (True, True, True, 1, False),
    (False, True, False, 8, False), (True, True, False, 8, False), (False, True, False, 8, True)])
def test_error_feedback_sees_the_written_weight(monkeypatch, sym, act_order, static, block,
                                                prefit):
    """Each column GPTQ rounds (and feeds the error of) is the column the returned codes,
    scales, zeros and g_idx dequantize to: a mismatch would leave errors uncorrected."""
    from tamis.quant.quantizer import gptq
    seen = {}
    real_solve = gptq.gptq_solve

    def spy(weight, hessian, perm, round_column, damp, block_size):
        def recorded(position, column, pending):
            seen[position] = round_column(position, column, pending).clone()
            return seen[position]
        seen["perm"] = perm
        return real_solve(weight, hessian, perm, recorded, damp, block_size)

    monkeypatch.setattr(gptq, "gptq_solve", spy)
    h = _correlated_hessian(96)
    w = torch.randn(16, 96)
    qw = gptq.gptq_quantize(w, h, 4, 32, sym, act_order, min_zero=0 if sym else 1,
                            weighted_clip=True, static_groups=static, act_order_block=block,
                            prefit=prefit)
    fed = torch.stack([seen[p] for p in range(96)], dim=1)
    assert torch.equal(fed, qw.dequantize()[:, seen["perm"]])


def test_act_order_block_keeps_runs_of_columns_together():
    h = torch.diag(torch.tensor([1., 5, 2, 0, 9, 0, 0, 0, 3, 3, 1]))
    assert visiting_order(h, True, 4).tolist() == [4, 5, 6, 7, 1, 2, 0, 3, 8, 9, 10]
    assert visiting_order(h, True).tolist()[:2] == [4, 1]
    assert torch.equal(visiting_order(h, False, 4), torch.arange(11))


def test_act_order_block_groups_are_unions_of_runs():
    h = _correlated_hessian(128)
    qw = gptq_quantize(torch.randn(8, 128), h, 4, 32, False, True, min_zero=1,
                       act_order_block=8)
    runs = qw.g_idx.long().reshape(16, 8)
    assert bool((runs == runs[:, :1]).all())  # each run of 8 columns sits in one group
    assert torch.equal(torch.bincount(qw.g_idx.long()), torch.full((4,), 32))
    assert not torch.equal(qw.g_idx.long(), torch.arange(128) // 32)


def test_prefit_grids_fit_dynamic_groups_on_the_original_weights():
    """With ``prefit`` each dynamic group's grid is the one fitted on the original weights
    of the columns g_idx puts in it; the groups (g_idx) are those of plain act order."""
    h = _correlated_hessian(96)
    w = torch.randn(16, 96)
    qw = gptq_quantize(w, h, 4, 32, False, True, min_zero=1, weighted_clip=True,
                       act_order_block=8, prefit=True)
    plain = gptq_quantize(w, h, 4, 32, False, True, min_zero=1, weighted_clip=True,
                          act_order_block=8)
    assert torch.equal(qw.g_idx, plain.g_idx)
    for g in range(3):
        cols = torch.nonzero(qw.g_idx == g).flatten()
        order = visiting_order(h, True, 8)
        cols = order[torch.isin(order, cols)]  # the order the fit saw them in
        scale, zero = fit_grid(w[:, cols], 4, False, 1, hessian=h[cols][:, cols])
        assert torch.equal(qw.scales[:, g], scale) and torch.equal(qw.zeros[:, g], zero)
    with pytest.raises(ValueError, match="--prefit-grids needs"):
        QuantizeOptions("gptq", prefit_grids=True)


def test_asym_dynamic_act_order_defaults_to_runs_of_a_quarter_group_with_refine():
    for group, block in ((128, 32), (64, 16), (32, 8), (-1, 32)):
        options = QuantizeOptions("gptq", desc_act=True, sym=False, group_size=group)
        assert (options.act_order_block, options.refine, options.refit) == (block, 1, True)
    for per_column in (QuantizeOptions("gptq", desc_act=True, sym=False, act_order_block=1),
                       QuantizeOptions("gptq", desc_act=True)):  # symmetric: GPTQ's order
        assert per_column.act_order_block == 1
        assert per_column.refine == 0 and not per_column.refit
    assert QuantizeOptions("gptq", desc_act=True, act_order_block=32).refine == 0  # sym runs
    for plain in (QuantizeOptions("gptq"), QuantizeOptions("gptq", desc_act=True,
                                                           static_groups=True)):
        assert plain.act_order_block == 1 and plain.refine == 1


def test_act_order_block_needs_desc_act_and_must_divide_the_group():
    with pytest.raises(ValueError, match="--act-order-block needs"):
        QuantizeOptions("gptq", act_order_block=32)
    with pytest.raises(ValueError, match="must divide the group size"):
        QuantizeOptions("gptq", desc_act=True, act_order_block=48)


@pytest.mark.parametrize("k", [7, 64, 300])
def test_inverse_cholesky_upper_is_gptqs_factor(k):
    """One factorization and one triangular solve give the upper factor of H^-1 that
    GPTQ's reference builds with two factorizations and an inverse."""
    from tamis.quant.quantizer.gptq import inverse_cholesky_upper
    h = _correlated_hessian(k) + 0.01 * torch.eye(k, dtype=torch.float64)
    reference = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)),
                                      upper=True)
    factor = inverse_cholesky_upper(h)
    assert torch.equal(factor, factor.triu())
    torch.testing.assert_close(factor, reference, rtol=0, atol=1e-4 * reference.abs().max())
    eye = torch.eye(k, dtype=torch.float64)
    residual = (factor.t() @ factor @ h - eye).abs().max()
    assert residual <= 4 * (reference.t() @ reference @ h - eye).abs().max() + 1e-12


def test_solves_run_on_one_thread_and_restore_the_count():
    """GPTQ's column loop runs on one thread (its small ops only wait on a second), and the
    caller's thread count comes back, also when the solve raises."""
    from tamis.quant.quantizer import gptq
    outer = torch.get_num_threads()
    torch.set_num_threads(2)
    seen = []

    def round_column(position, column, pending):
        seen.append(torch.get_num_threads())
        if position == 3:
            raise RuntimeError("stop")
        return column.round()

    h = _correlated_hessian(16)
    try:
        with pytest.raises(RuntimeError, match="stop"):
            gptq.gptq_solve(torch.randn(4, 16), h, torch.arange(16), round_column)
        assert seen == [1, 1, 1, 1]
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(outer)


def test_layers_of_unknown_linears_solve_each_linear_alone():
    """Only the Llama-style q/k/v, o, gate/up, down layout shares Hessians and stacks rows;
    other linears (a fused qkv_proj of another input width...) get one stage each."""
    from tamis.quant.quantizer.pipeline import _stages
    linears = {"self_attn.qkv_proj": None, "self_attn.o_proj": None,
               "mlp.gate_up_proj": None, "mlp.down_proj": None}
    assert _stages(linears) == [[name] for name in linears]
