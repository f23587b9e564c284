"""A kernel's interpreted launch works whatever ``TRITON_INTERPRET`` says *now*: what counts
is the mode Triton's library was built in when Triton was imported."""
import os
import subprocess
import sys

import pytest

_SCRIPT = """
import os
os.environ.pop("TRITON_INTERPRET", None)
import torch, triton                      # the library is built for the GPU here
from triton.language import standard
from triton.runtime.jit import JITFunction
assert isinstance(standard.zeros, JITFunction)
os.environ["TRITON_INTERPRET"] = "1"      # set later, as a test directory's conftest does
from tamis.kernels.norm import rms_norm_ref, rms_norm_triton
x, w = torch.randn(3, 64), torch.randn(64)
torch.testing.assert_close(rms_norm_triton(x, w, 1e-6), rms_norm_ref(x, w, 1e-6))
print("ok")
"""


def test_interpreted_launch_after_triton_imported_for_the_gpu():
    pytest.importorskip("triton")
    done = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_importing_the_engine_leaves_triton_unimported():
    """Kernel modules load on first use: importing the engine must not fix Triton's library
    mode before a test (or a user) sets TRITON_INTERPRET."""
    code = ("import sys, tamis.engine.llm, tamis.engine.gpu_runner, tamis.engine.models.llama, "
            "tamis.engine.layers.linear, tamis.engine.layers.embedding; "
            "print('triton' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stderr[-2000:]


def test_prefill_kernel_compiles_one_variant_for_any_metadata_offset():
    """Mixed steps hand the prefill kernel views that start 4 bytes a leading decode past
    an aligned address; specialized on alignment, the first such step compiled a second
    variant mid-serving (measured on an H100: the only compile of a W1 pass after warm-up)."""
    pytest.importorskip("triton")
    code = ("from tamis.kernels.attention_prefill import _prefill_kernel as k; "
            "jit = k._variant(False); "
            "print(sorted(p.name for p in jit.params if p.do_not_specialize_on_alignment))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "TRITON_INTERPRET": "0"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "['bt_ptr', 'qsl_ptr', 'seq_lens_ptr']"
