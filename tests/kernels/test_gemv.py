"""The row-streaming GEMV on dense weights and the ``linear`` dispatcher (the FP8 use of
the same kernel is tested in test_fp8.py)."""
import pytest
import torch
import torch.nn.functional as F

from tamis.kernels import gemv


@pytest.mark.parametrize("m,n,k,tiles", [
    (1, 40, 300, gemv.GemvTiles(16, 64, 1)),                  # N and K tails, no split
    (1, 48, 520, gemv.GemvTiles(16, 64, 3, loop_stages=3)),   # split-K, loads pipelined
    (3, 33, 256, gemv.GemvTiles(16, 128, 2)),                 # several rows
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dense_weights_without_scale_match_fp32_product(m, n, k, tiles, dtype):
    torch.manual_seed(0)
    x = torch.randn(m, k).to(dtype)
    weight = torch.randn(n, k).to(dtype)
    want = x.float() @ weight.float().t()
    got = gemv.gemv_triton(x, weight, None, tiles)
    assert got.dtype == dtype
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), want, rtol=tol, atol=tol * want.abs().max().item())


@pytest.mark.parametrize("m,split", [(1, 3), (1, 4), (3, 2)])
def test_last_split_sum_equals_the_last_arrivals_bit_for_bit(m, split):
    """Both split-K reductions add the same fp32 partials in the same order (the
    interpreter runs the programs one after the other, the last split last; the GPU's
    concurrent case is test_fp8.py's)."""
    torch.manual_seed(3)
    x, weight, scale = torch.randn(m, 520), torch.randn(40, 520), torch.rand(40) + 0.5
    at_arrival = gemv.GemvTiles(16, 64, split)
    at_last = gemv.GemvTiles(16, 64, split, last_split_reduces=True)
    want = gemv.gemv_triton(x, weight, scale, at_arrival)
    assert torch.equal(gemv.gemv_triton(x, weight, scale, at_last), want)
    assert torch.equal(gemv.gemv_triton(x, weight, scale, at_last), want)  # counters reset
    torch.testing.assert_close(want, x @ (weight * scale[:, None]).t(), rtol=1e-4, atol=1e-4)


def test_scale_multiplies_each_output_column():
    torch.manual_seed(1)
    x, weight, scale = torch.randn(2, 96), torch.randn(24, 96), torch.rand(24) + 0.5
    got = gemv.gemv_triton(x, weight, scale, gemv.GemvTiles(8, 32, 2))
    torch.testing.assert_close(got, x @ (weight * scale[:, None]).t(), rtol=1e-4, atol=1e-4)


def test_linear_is_f_linear_off_cuda():
    torch.manual_seed(2)
    x, weight, bias = torch.randn(1, 64).bfloat16(), torch.randn(32, 64).bfloat16(), None
    assert torch.equal(gemv.linear(x, weight, bias), F.linear(x, weight, bias))
    bias = torch.randn(32).bfloat16()
    assert torch.equal(gemv.linear(x, weight, bias), F.linear(x, weight, bias))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("k,n", [(4096, 6144), (14336, 4096), (576, 49152), (100, 70)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_linear_one_row_on_gpu_runs_the_gemv(k, n, dtype):
    """One row goes through the GEMV (fresh inputs each run) and matches the fp32 product
    as closely as cuBLAS does; a bias or two rows keep cuBLAS (bit-equal to F.linear)."""
    x = torch.randn(1, 1, k, device="cuda").to(dtype)
    weight = (torch.randn(n, k, device="cuda") * 0.02).to(dtype)
    want = x.float() @ weight.float().t()
    got = gemv.linear(x, weight)
    assert got.shape == (1, 1, n) and got.dtype == dtype
    err = (got.float() - want).abs().max().item()
    cublas_err = (F.linear(x, weight).float() - want).abs().max().item()
    assert err <= 2 * cublas_err + 1e-6 * want.abs().max().item()
    bias = torch.randn(n, device="cuda").to(dtype)
    assert torch.equal(gemv.linear(x, weight, bias), F.linear(x, weight, bias))
    two = torch.randn(2, k, device="cuda").to(dtype)
    assert torch.equal(gemv.linear(two, weight), F.linear(two, weight))
