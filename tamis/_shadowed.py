"""A room imported under its bare name, where an installed package owns that name.

The rooms (``kernels/``, ``engine/``, ...) are packages at the top of a checkout, which
``tamis`` maps as ``tamis.<room>``. A Python started in the checkout (a REPL, ``python
-c``, pytest's ``pythonpath = ["."]``) also sees them under their bare names, first on
``sys.path``. ``kernels`` is also the name of a PyPI package, Hugging Face's hub kernels,
which transformers >= 5.25 requires and imports as it loads a model: without this, that
import finds the room and fails.
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path


def hand_name_to_installed(name: str, room_init: str) -> None:
    """Called by a room's ``__init__`` when it runs as the top-level module ``name``: if a
    package ``name`` is installed outside this checkout, load it and leave it in
    ``sys.modules[name]``, which the running import then returns in place of the room.
    Without one installed, the room stays (nothing asked for another)."""
    checkout = Path(room_init).resolve().parent.parent
    path = [entry for entry in sys.path if Path(entry or os.curdir).resolve() != checkout]
    spec = importlib.machinery.PathFinder.find_spec(name, path)
    if spec is None or spec.loader is None:
        return
    room = sys.modules[name]
    installed = importlib.util.module_from_spec(spec)
    sys.modules[name] = installed
    try:
        spec.loader.exec_module(installed)
    except BaseException:
        sys.modules[name] = room
        raise
