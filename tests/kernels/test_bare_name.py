"""The kernels subpackage under its bare name. A Python started in a checkout (a REPL,
``python -c``, ``python -m pytest``) finds the subpackage as ``kernels``, first on
``sys.path``; the PyPI package ``kernels`` (Hugging Face's hub kernels, which transformers
>= 5.25 requires and imports as it loads a model) must still be what that name imports."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _python_in_checkout(code: str, extra_path: Path | None = None) -> str:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if extra_path is not None:  # after the checkout, as site-packages would be
        env["PYTHONPATH"] = str(extra_path)
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout.strip()


def test_an_installed_kernels_package_wins_over_the_subpackage(tmp_path):
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "__init__.py").write_text("OWNER = 'installed'\n")
    out = _python_in_checkout(
        "import kernels, tamis.kernels as sub; print(kernels.OWNER, sub.rms_norm.__name__)",
        tmp_path)
    assert out == "installed rms_norm"


def test_without_one_the_bare_name_is_the_subpackage():
    out = _python_in_checkout(
        "import importlib.machinery as m, sys\n"
        "sys.path[:] = [p for p in sys.path if m.PathFinder.find_spec('kernels', [p]) is None"
        " or p in ('', '.')]\n"
        "import kernels; print(kernels.__file__)")
    assert Path(out).resolve() == ROOT / "kernels" / "__init__.py"


def test_transformers_loads_its_hub_kernels_integration_in_a_checkout():
    assert _python_in_checkout(
        "import transformers.integrations.hub_kernels as h; print(h.__name__)") == \
        "transformers.integrations.hub_kernels"
