"""A separate virtualenv holding the quantization libraries tamis is cross-checked against.

llm-compressor 0.14 pins transformers 5.17 and AutoAWQ 0.2.9 expects older transformers,
so they live apart from tamis's own environment: a venv that sees this environment's
packages (torch, CPU build) through a .pth file, with the libraries and their pins
installed on top (its own site-packages come first on sys.path).

``library_python()`` returns that venv's python: ``$TAMIS_QUANT_LIBS_PYTHON`` if set,
else ``<tamis cache>/venvs/quant-libs-<tag>`` (created on first use, with pip from PyPI;
about a minute). The cache outlives the environment that made it (a clone deleted, a
checkout moved), so every call rewrites the .pth to name the running environment's
packages: a .pth naming a gone environment hid torch from the scripts once in CI.
``run_library(kind, model_dir, out_dir)`` runs library_quantize.py there, caching each
(kind, model) result under the same cache for the session (``run_library_moe``: every
mixture-of-experts kind in one run); ``transformers_forward``
loads a checkpoint there with transformers + compressed-tensors.

A test that needs the venv calls ``library_python_or_skip()``: where the venv cannot be
built (no PyPI) the test is skipped, except with ``TAMIS_REQUIRE_QUANT_LIBS=1`` (CI),
where that is a failure.
"""
from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

PINS = ("llmcompressor==0.14.0.1", "autoawq==0.2.9", "zstandard")
TAG = "llmc0.14.0.1-awq0.2.9"
SCRIPT = Path(__file__).with_name("library_quantize.py")
PARENT_PTH = "_tamis_parent_env.pth"


class LibraryUnavailable(RuntimeError):
    pass


def _venv_dir() -> Path:
    from tamis.engine.embedded import cache_root
    return cache_root() / "venvs" / f"quant-libs-{TAG}"


def library_python() -> Path:
    override = os.environ.get("TAMIS_QUANT_LIBS_PYTHON")
    if override:
        return Path(override)
    venv = _venv_dir()
    python = venv / "bin" / "python"
    if not ((venv / ".complete").exists() and python.exists()):
        _create(venv)
    _see_parent_env(venv)
    return python


def _venv_site_packages(venv: Path) -> Path:
    return Path(sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)}))


def _see_parent_env(venv: Path) -> None:
    """Points the venv's .pth at this environment's packages (pure and platform ones: on
    some systems torch lives in the second); the venv's own packages still come first."""
    paths = dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib"))
    _venv_site_packages(venv).joinpath(PARENT_PTH).write_text("".join(p + "\n" for p in paths))


def _create(venv: Path) -> None:
    venv.parent.mkdir(parents=True, exist_ok=True)
    try:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True,
                       capture_output=True, text=True, timeout=300)
        python = venv / "bin" / "python"
        _see_parent_env(venv)
        # AutoAWQ builds from an sdist without build isolation (its setup.py imports torch),
        # so the venv needs a setuptools that has bdist_wheel: the one a Python 3.11 venv
        # starts with (65.x) lacks it unless `wheel` is installed.
        subprocess.run([str(python), "-m", "pip", "install", "-q", "setuptools>=70.1", "wheel"],
                       check=True, capture_output=True, text=True, timeout=600)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-build-isolation", *PINS],
                       check=True, capture_output=True, text=True, timeout=1200)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
        detail = getattr(exc, "stderr", "") or str(exc)
        raise LibraryUnavailable(f"could not build the library venv at {venv}: "
                                 f"{detail.strip()[-800:]}") from exc
    (venv / ".complete").write_text(" ".join(PINS))


def library_python_or_skip() -> Path:
    import pytest
    try:
        return library_python()
    except LibraryUnavailable as exc:
        if os.environ.get("TAMIS_REQUIRE_QUANT_LIBS") == "1":
            raise
        pytest.skip(f"quantization libraries unavailable (needs PyPI access once): {exc}")


def in_library_venv(script: str, *args: str) -> None:
    """Runs ``script`` (Python source) with the library venv's python; AssertionError
    with its output tail when it fails."""
    python = library_python_or_skip()
    proc = subprocess.run([str(python), "-c", script, *args], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]


_TRANSFORMERS_FORWARD = """
import json, sys, torch
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32).eval()
with torch.no_grad():
    logits = model(torch.tensor([json.loads(sys.argv[2])])).logits[0]
weights = {name: module.weight.detach().float() for name, module in model.named_modules()
           if isinstance(module, torch.nn.Linear) and name != "lm_head"}
torch.save({"logits": logits, "weights": weights}, sys.argv[3])
"""


def transformers_forward(model_dir: Path, prompt: list[int], out: Path) -> dict:
    """transformers (with compressed-tensors installed) on ``model_dir`` in float32:
    {"logits": of ``prompt``, "weights": {decoder linear name: its decompressed weight}}."""
    import json

    import torch
    in_library_venv(_TRANSFORMERS_FORWARD, str(model_dir), json.dumps(prompt), str(out))
    return torch.load(out)


def run_library(kind: str, model_dir: Path, out_dir: Path, *extra: str) -> Path:
    """Runs ``library_quantize.py kind model_dir out_dir`` in the library venv (once per
    out_dir); returns out_dir. Raises RuntimeError with the script's output tail."""
    if (out_dir / "reference" / "dequantized.safetensors").exists():
        return out_dir
    python = library_python()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run([str(python), str(SCRIPT), kind, str(model_dir), str(out_dir), *extra],
                          capture_output=True, text=True, timeout=900, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{kind} failed in the library venv:\n{(proc.stdout + proc.stderr)[-3000:]}")
    return out_dir


def run_library_moe(model_dir: Path, out_root: Path) -> Path:
    """Every llm-compressor MoE kind of library_quantize.py on ``model_dir`` in one venv
    run (``moe-all``), once per out_root; returns out_root, which holds one folder per
    kind. Raises as ``run_library``."""
    from library_quantize import MOE_KINDS

    if all((out_root / kind / "reference" / "dequantized.safetensors").exists()
           for kind in MOE_KINDS):
        return out_root
    return run_library("moe-all", model_dir, out_root)
