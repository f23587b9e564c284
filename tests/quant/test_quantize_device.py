"""`tamis quantize --device`: the device is resolved with a clear error for one this
machine lacks; the streaming AWQ row sample equals the row sample of the concatenated
inputs; and on CUDA (tests marked gpu) the layer-by-layer run on the GPU gives the CPU's
result within float tolerance, holding one decoder layer at a time."""
from __future__ import annotations

import pytest
import torch

from tamis.cli import main
from tamis.quant.quantizer.awq import RowSample, subsample
from tamis.quant.quantizer.device import activation_home, resolve_device
from tamis.quant.quantizer.pipeline import QuantizeOptions, quantize_checkpoint

from test_roundtrip import SHAPES, _round_trip, one_layer, samples, tiny  # noqa: F401

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.parametrize("name", ["tpu", "gpu", "cuda:x", "mps"])
def test_unknown_device_names_the_choices(name):
    with pytest.raises(ValueError, match=r"--device .*choose one of auto, cpu, cuda, cuda:N"):
        QuantizeOptions("gptq", device=name)


def test_missing_cuda_device_is_a_clear_error():
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    wanted = f"cuda:{count}"  # one past the last device this machine has
    expected = "no CUDA device" if count == 0 else f"has {count} CUDA device"
    with pytest.raises(ValueError, match=f"--device {wanted}: .*{expected}"):
        QuantizeOptions("gptq", device=wanted)


def test_cli_reports_a_bad_device_before_loading(tmp_path, capsys):
    code = main(["quantize", "--method", "gptq", "--output", str(tmp_path / "out"),
                 "--device", "tpu"])
    assert code == 2
    assert "--device 'tpu'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_auto_picks_cuda_when_there_is_one():
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto").type == expected
    assert QuantizeOptions("gptq").compute_device.type == expected
    assert QuantizeOptions("gptq", device="cpu").compute_device == torch.device("cpu")


def test_activations_stay_on_the_device_only_when_they_fit():
    gpu = torch.device("cuda", 0)  # free memory given: nothing is asked of CUDA
    assert activation_home(gpu, nbytes=100, free_bytes=400) == gpu
    assert activation_home(gpu, nbytes=101, free_bytes=400) == torch.device("cpu")
    assert activation_home(torch.device("cpu"), nbytes=10**15) == torch.device("cpu")


@pytest.mark.parametrize("sizes", [[300, 1, 250, 77], [40, 60], [512]])
def test_row_sample_equals_subsample_of_concatenation(sizes):
    batches = [torch.randn(n, 24) for n in sizes]
    sample = RowSample(sum(sizes))
    for batch in batches:
        sample.add(batch)
    assert torch.equal(sample.rows(), subsample(torch.cat(batches)))


def test_awq_on_cpu_with_a_row_sample(one_layer, tmp_path):  # noqa: F811
    """device="cpu" with more calibration rows than the AWQ search keeps (its streaming
    row sample picks rows in every window): the written checkpoint reloads in tamis to
    the quantizer's weights and the dequantized model's logits."""
    windows = [torch.randint(300, 5000, (300,), generator=torch.Generator().manual_seed(i))
               for i in range(2)]
    for awq_gptq in (True, False):  # the scale search, then the clip search on the sample
        options = QuantizeOptions("awq", group_size=64, awq_gptq=awq_gptq, output_clip=False,
                                  device="cpu")
        _round_trip(one_layer, tmp_path / str(awq_gptq), options, windows, layers=1)


# ------------------------------------------------------------------------- CUDA

def _quantize(path, tmp_path, name: str, samples, **options):
    return quantize_checkpoint(path, tmp_path / name, QuantizeOptions(**options),
                               progress=False, samples=samples)


@torch.no_grad()
def _logits(model, ids):
    return model(torch.tensor([ids])).logits[0].double()


CUDA_CASES = [dict(method="gptq"),  # rotation, output clip, static groups, refine
              dict(method="gptq", desc_act=True, sym=False, true_sequential=True),
              dict(method="gptq", awq_scales=True, descent=1, rotate=False),
              dict(method="awq", group_size=64),
              dict(method="awq", group_size=64, awq_gptq=False, output_clip=False),
              dict(method="fp8")]


def _codes(weight) -> torch.Tensor:
    return weight.weight.float() if hasattr(weight, "weight") else weight.codes


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("case", CUDA_CASES, ids=lambda c: "-".join(map(str, c.values())))
def test_cuda_quantize_matches_cpu(tiny, tmp_path, case):  # noqa: F811
    """The same method on either device. GPTQ's rounding is not a continuous function of
    its inputs (a tie broken the other way changes the error spread over the rest of the
    row, and the next layer's inputs), so: layer 0, whose inputs agree to float rounding,
    keeps nearly every code; the whole model quantizes as well on the GPU (the logit
    change from the original model within 20% of the CPU's)."""
    from transformers import AutoModelForCausalLM

    windows = [torch.randint(300, 5000, (300,), generator=torch.Generator().manual_seed(i))
               for i in range(2)]  # > 512 rows: the AWQ row sample picks in each window
    cpu = _quantize(tiny, tmp_path, "cpu", windows, device="cpu", **case)
    cuda = _quantize(tiny, tmp_path, "cuda", windows, device="cuda", **case)
    assert all(p.device.type == "cpu" for p in cuda.reference_model.parameters())
    assert cuda.weights.keys() == cpu.weights.keys()
    equal = total = 0
    for name, expected in cpu.weights.items():
        got = _codes(cuda.weights[name])
        assert got.device.type == "cpu" and got.shape == _codes(expected).shape, name
        if name.startswith("model.layers.0."):
            equal += int((got == _codes(expected)).sum())
            total += got.numel()
    assert equal >= 0.9 * total, f"layer 0: {equal / total:.3f} of the codes agree"
    prompt = list(range(300, 340))
    original = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32).eval()
    reference = _logits(original, prompt)
    error_cpu = (_logits(cpu.reference_model, prompt) - reference).norm()
    error_cuda = (_logits(cuda.reference_model, prompt) - reference).norm()
    assert abs(error_cuda - error_cpu) <= 0.2 * error_cpu, (error_cuda, error_cpu)


@pytest.mark.gpu
@needs_cuda
def test_cuda_rtn_is_bit_identical_to_cpu(tiny, tmp_path):  # noqa: F811
    """Round to nearest is exact arithmetic (min, max, one division, rounding): the GPU
    writes the CPU's file."""
    for device in ("cpu", "cuda"):
        _quantize(tiny, tmp_path, device, None, method="gptq", rtn=True, group_size=64,
                  device=device)
    assert ((tmp_path / "cpu" / "model.safetensors").read_bytes()
            == (tmp_path / "cuda" / "model.safetensors").read_bytes())


@pytest.mark.gpu
@needs_cuda
def test_cuda_holds_one_layer_at_a_time(tiny_checkpoint, tmp_path, monkeypatch):
    """Device memory as each layer's outputs are computed stays flat over four layers
    (it would grow by a layer per step if layers stayed), and nothing is left on the
    device after the run."""
    from tamis.quant.quantizer import calibration

    path = tiny_checkpoint("llama", num_hidden_layers=4, **SHAPES)
    windows = [torch.randint(300, 5000, (128,), generator=torch.Generator().manual_seed(0))]
    in_use, run_layer = [], calibration.run_layer

    def recording_run_layer(layer, inputs, kwargs):
        in_use.append(torch.cuda.memory_allocated())
        return run_layer(layer, inputs, kwargs)

    # A first run creates what CUDA libraries keep for the process (cuBLAS workspaces).
    _quantize(path, tmp_path, "warm-up", windows, method="gptq", device="cuda")
    monkeypatch.setattr(calibration, "run_layer", recording_run_layer)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    result = _quantize(path, tmp_path, "q", windows, method="gptq", device="cuda")
    torch.cuda.synchronize()
    layer = result.reference_model.model.layers[0]
    layer_bytes = sum(p.numel() * p.element_size() for p in layer.parameters())
    assert len(in_use) == 4
    assert min(in_use) - before >= layer_bytes  # the layer is on the device in its turn
    assert max(in_use) - min(in_use) < layer_bytes, in_use
    assert torch.cuda.memory_allocated() - before < layer_bytes
