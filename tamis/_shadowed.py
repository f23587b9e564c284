"""A subpackage imported under its bare name, where an installed package owns that name.

The subpackages (``kernels/``, ``engine/``, ...) are folders at the top of a checkout, which
``tamis`` maps as ``tamis.<name>``. A Python started at the repository root (a REPL,
``python -c``, ``python -m pytest``) also sees them under their bare names, first on
``sys.path``. ``kernels`` is also the name of a PyPI package, Hugging Face's hub kernels,
which transformers >= 5.25 requires and imports as it loads a model: without this, that
import finds the subpackage and fails.
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path


def hand_name_to_installed(name: str, subpackage_init: str) -> None:
    """Called by a subpackage's ``__init__`` when it runs as the top-level module ``name``:
    if a package ``name`` is installed outside this checkout, load it and leave it in
    ``sys.modules[name]``, which the running import then returns in place of the
    subpackage. Without one installed, the subpackage stays (nothing asked for another)."""
    checkout = Path(subpackage_init).resolve().parent.parent
    path = [entry for entry in sys.path if Path(entry or os.curdir).resolve() != checkout]
    spec = importlib.machinery.PathFinder.find_spec(name, path)
    if spec is None or spec.loader is None:
        return
    subpackage = sys.modules[name]
    installed = importlib.util.module_from_spec(spec)
    sys.modules[name] = installed
    try:
        spec.loader.exec_module(installed)
    except BaseException:
        sys.modules[name] = subpackage
        raise
