"""Session-scoped fixtures shared by every test subpackage.

- ``tiny_checkpoint(arch, **overrides) -> Path``: a tiny random checkpoint
  (see ``tests/tiny_models.py``), built once per (arch, overrides) per session.
- ``smollm2_path``: the embedded SmolLM2-135M-Instruct HF folder.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # so tests can `import tiny_models`

# Without a GPU every Triton kernel runs interpreted. Set before any test module is
# collected: a module that imports a plain ``@triton.jit`` kernel (an engine or quant test
# importing kernels/) fixes that kernel's mode at import, and tests/ is collected in
# alphabetical order, before tests/kernels/conftest.py would set it.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from tiny_models import make_tiny_checkpoint  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device (skipped without one)")
    config.addinivalue_line("markers", "network: installs a package from PyPI on first use")


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    cache: dict[str, Path] = {}

    def factory(arch: str, **config_overrides) -> Path:
        key = arch + json.dumps(config_overrides, sort_keys=True, default=str)
        if key not in cache:
            folder = tmp_path_factory.mktemp(f"tiny-{arch}")
            cache[key] = make_tiny_checkpoint(arch, folder, **config_overrides)
        return cache[key]

    return factory


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    from tamis.engine.embedded import default_model_path
    return default_model_path()
