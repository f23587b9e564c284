"""The cached library venv (tests/quant/libraries.py) sees the running environment's
packages even when the environment that made it is gone: CI once found a cached venv
whose .pth named a deleted clone's .venv, and every cross-library script failed to
import torch."""
from __future__ import annotations

import sysconfig
from pathlib import Path

import libraries


def _cached_venv(cache: Path) -> Path:
    venv = cache / "venvs" / f"quant-libs-{libraries.TAG}"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()
    (venv / ".complete").write_text(" ".join(libraries.PINS))
    return venv


def test_a_cached_venv_is_pointed_at_the_running_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("TAMIS_QUANT_LIBS_PYTHON", raising=False)
    monkeypatch.setenv("TAMIS_CACHE_DIR", str(tmp_path))
    venv = _cached_venv(tmp_path)
    site = libraries._venv_site_packages(venv)
    site.mkdir(parents=True)
    (site / libraries.PARENT_PTH).write_text("/gone/clone/.venv/lib/python3.11/site-packages\n")

    assert libraries.library_python() == venv / "bin" / "python"

    lines = (site / libraries.PARENT_PTH).read_text().splitlines()
    assert "/gone/clone/.venv/lib/python3.11/site-packages" not in lines
    assert sysconfig.get_paths()["purelib"] in lines
    assert sysconfig.get_paths()["platlib"] in lines
    assert all(Path(line).is_dir() for line in lines)


def test_venv_site_packages_lies_inside_the_venv(tmp_path):
    site = libraries._venv_site_packages(tmp_path / "venv")
    assert site.is_relative_to(tmp_path / "venv") and site.name == "site-packages"
