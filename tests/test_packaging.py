"""Packaging: the wheel holds the ``tamis`` package alone, complete, and the package a
script imports is the installed one even beside a clone folder named ``tamis/``.

The wheel is built once per run from a copy of the sources, with the setuptools of this
environment (no network): about two seconds.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import tamis
from tamis.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
SUBPACKAGES = ("engine", "constrain", "quant", "kernels", "server")
SOURCES = ("pyproject.toml", "setup.py", "README.md", "LICENSE", "tamis", *SUBPACKAGES)
IMPORT_ORIGINS = ("import tamis, tamis.engine.config, tamis.commands.serve; "
                  "print(tamis.__file__); print(tamis.engine.config.__file__); "
                  "print(tamis.commands.serve.__file__)")


def _python(code: str, cwd: Path, **env: str) -> list[str]:
    """Runs ``python -c code`` in ``cwd`` (first on its sys.path, as for any script) and
    returns its output lines; fails the test with the child's stderr if it fails."""
    child_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSAFEPATH")}
    child_env.update(env)
    done = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=child_env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


@pytest.fixture(scope="module")
def checkout_copy(tmp_path_factory) -> Path:
    copy = tmp_path_factory.mktemp("checkout")
    for name in SOURCES:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, copy / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, copy / name)
    return copy


@pytest.fixture(scope="module")
def wheel(checkout_copy, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    build = "import sys; from setuptools import build_meta; print(build_meta.build_wheel(sys.argv[1]))"
    done = subprocess.run([sys.executable, "-c", build, str(out)], cwd=checkout_copy,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    return out / done.stdout.splitlines()[-1]


def test_wheel_installs_only_the_tamis_package(wheel):
    top_level = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert top_level == {"tamis", f"tamis-{tamis.__version__}.dist-info"}


def test_wheel_holds_every_module_of_the_checkout(wheel, checkout_copy):
    in_wheel = {name for name in zipfile.ZipFile(wheel).namelist() if name.endswith(".py")}
    expected = {f"tamis/{path.relative_to(checkout_copy / 'tamis').as_posix()}"
                for path in (checkout_copy / "tamis").rglob("*.py")}
    for name in SUBPACKAGES:
        expected |= {f"tamis/{path.relative_to(checkout_copy).as_posix()}"
                     for path in (checkout_copy / name).rglob("*.py")}
    assert in_wheel == expected


def test_wheel_holds_the_compiled_constraint_core(wheel):
    """setup.py builds constrain/_native*.c into the wheel (optional only where no C
    compiler is found: the machines that run this suite have one)."""
    names = zipfile.ZipFile(wheel).namelist()
    assert [n for n in names if n.startswith("tamis/constrain/_native") and n.endswith(".so")], \
        [n for n in names if n.startswith("tamis/constrain/")][:5]
    assert not [n for n in names if n.endswith((".c", ".h"))]


def test_cli_has_no_bench_command(capsys):
    """The benchmarks are scripts of a checkout (``python bench/bench_NAME.py``): a wheel
    has none to run."""
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "offline"])
    assert "invalid choice: 'bench'" in capsys.readouterr().err


def test_unpacked_wheel_is_imported_beside_a_clone_folder(wheel, tmp_path):
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    work = tmp_path / "work"
    work.mkdir()
    (work / "tamis").symlink_to(ROOT, target_is_directory=True)  # `git clone ... tamis`
    origins = _python(IMPORT_ORIGINS, work, PYTHONPATH=str(site))
    assert [Path(p).is_relative_to(site) for p in origins] == [True, True, True], origins


def test_installed_package_is_imported_beside_a_clone_folder(tmp_path):
    """Needs tamis installed in this environment (``pip install -e .`` or a wheel), as
    ``make test`` does: a script beside the clone folder must not get the folder."""
    (tmp_path / "tamis").symlink_to(ROOT, target_is_directory=True)
    origins = _python(IMPORT_ORIGINS + "; from tamis import __version__", tmp_path)
    assert all(p != "None" and not Path(p).is_relative_to(tmp_path) for p in origins), origins


def test_checkout_finds_a_new_module_without_reinstalling(checkout_copy):
    module = checkout_copy / "engine" / "added_after_install.py"
    module.write_text("ANSWER = 42\n")
    try:
        lines = _python("import tamis.engine.added_after_install as m; print(m.__file__, m.ANSWER)",
                        checkout_copy)
    finally:
        module.unlink()
    assert lines == [f"{module.resolve()} 42"]
