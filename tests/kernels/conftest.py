"""Kernel tests: every Triton kernel against its plain-torch reference.

On CPU the kernels run under the Triton interpreter (``tamis.kernels._triton.kernel``
picks the interpreted variant for CPU tensors, whatever ``TRITON_INTERPRET`` was at
import time), so shapes stay small. Tests marked ``gpu`` run at real shapes on CUDA,
compiled (tests/conftest.py sets ``TRITON_INTERPRET`` only where there is no GPU),
and are skipped, saying so, where there is none.
"""
from __future__ import annotations

import os

import pytest
import torch


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device (real shapes, compiled kernels)")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def device() -> str:
    """Where the non-``gpu`` tests run their kernels: CPU (interpreter) in CI."""
    return "cpu"


@pytest.fixture(autouse=True)
def _seed_free_random():
    """Fresh random inputs each run, but reproducible from the printed seed on failure."""
    seed = int.from_bytes(os.urandom(4), "little")
    torch.manual_seed(seed)
    print(f"torch seed {seed}")   # shown by pytest when the test fails
    yield seed
