"""examples/docker/Dockerfile builds what the README sets up.

Its RUN steps after the system packages are the commands of the Makefile's ``setup``
recipe, in order (as ``make -n`` prints them with the Makefile's defaults); everything that
recipe installs is named in the README's set-up; the image starts on a CUDA base and its
default command is the README's ``make serve``, listening on the port it exposes.
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path

ROOT = Path(__file__).parents[2]
DOCKERFILE = ROOT / "examples" / "docker" / "Dockerfile"
# Variables that would change what `make -n` prints: the Makefile's knobs, and what an
# enclosing `make test VAR=...` passes down to a nested make.
MAKE_OVERRIDES = ("PYTHON", "VENV", "TORCH", "TORCH_PIP_ARGS", "MAKEFLAGS", "MFLAGS",
                  "MAKELEVEL")


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of each Dockerfile instruction, continuation lines joined."""
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines()]
    return [(line.split(None, 1)[0].upper(), " ".join(line.split()[1:]))
            for line in lines if line and not line.startswith("#")]


def _arguments(instruction: str) -> list[str]:
    return [args for name, args in _instructions() if name == instruction]


def _setup_recipe() -> list[str]:
    env = {k: v for k, v in os.environ.items() if k not in MAKE_OVERRIDES}
    run = subprocess.run(["make", "-n", "-B", "setup"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=60, check=True)
    return [" ".join(line.split()) for line in run.stdout.splitlines() if line.strip()]


def _readme() -> str:
    return (ROOT / "README.md").read_text().replace('"', "")


def test_run_steps_are_the_makefile_setup():
    system_packages, *steps = _arguments("RUN")
    assert system_packages.startswith("apt-get update")
    assert steps == _setup_recipe()


def test_the_readme_names_what_the_setup_installs():
    installs = [step.split("pip install", 1)[1] for step in _setup_recipe() if "pip install" in step]
    assert len(installs) == 3   # torch, tamis with its test extras, the embedded model
    for install in installs:
        assert " ".join(install.replace('"', "").split()) in _readme(), install


def test_image_is_cuda_and_serves_the_readme_way():
    [base] = _arguments("FROM")
    assert base.startswith("nvidia/cuda:")
    [cmd] = _arguments("CMD")
    make, target, *variables = json.loads(cmd)
    assert (make, target) == ("make", "serve") and "make serve" in _readme()
    [serve_args] = [v.split("=", 1)[1] for v in variables if v.startswith("ARGS=")]
    serve_args = shlex.split(serve_args)
    assert serve_args[serve_args.index("--host") + 1] == "0.0.0.0"   # reachable from outside
    [port] = _arguments("EXPOSE")
    assert serve_args[serve_args.index("--port") + 1] == port
