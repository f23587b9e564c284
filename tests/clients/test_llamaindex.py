"""LlamaIndex (llama-index-llms-openai-like) against a live ``tamis serve``: structured
output as LlamaIndex asks for it (a required tool call carrying the model's schema) parses
into the pydantic class and validates.

LlamaIndex pins ``openai<3`` and brings ~40 packages (nltk, SQLAlchemy, pillow...), so it
lives apart from tamis's environment: installed with pip on first use into
``<tamis cache>/clients/llama-index`` (again when the pins change) and put first on the PYTHONPATH of a child
that runs ``llamaindex_client.py``. Where it cannot be installed the test skips, unless
``TAMIS_REQUIRE_CLIENT_LIBS=1`` (CI): then it fails.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from live_server import MODEL_NAME

from .client_setup import KEY, MAX_TOKENS, City

pytestmark = pytest.mark.network   # LlamaIndex is installed from PyPI on first use
PINS = ("llama-index-llms-openai-like==0.8.1", "llama-index-llms-openai==0.8.3",
        "llama-index-core==0.14.25")
CLIENT_SCRIPT = Path(__file__).with_name("llamaindex_client.py")


def _llamaindex_dir() -> Path:
    """The folder holding LlamaIndex and its dependencies, installed there on first use."""
    from tamis.engine.embedded import cache_root
    target = cache_root() / "clients" / "llama-index"
    complete = target / ".complete"
    if complete.exists() and complete.read_text() == "\n".join(PINS):
        return target
    shutil.rmtree(target, ignore_errors=True)   # what a failed install left
    result = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--target",
                             str(target), *PINS], capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        message = f"could not install {' '.join(PINS)}: {result.stderr.strip()[-600:]}"
        if os.environ.get("TAMIS_REQUIRE_CLIENT_LIBS") == "1":
            pytest.fail(message)
        pytest.skip(message)
    complete.write_text("\n".join(PINS))
    return target


def test_structured_predict_and_structured_llm(server):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_llamaindex_dir()),
                                                      env.get("PYTHONPATH")]))
    run = subprocess.run([sys.executable, str(CLIENT_SCRIPT), server, KEY, MODEL_NAME,
                          str(MAX_TOKENS)], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    answers = {line["call"]: line for line in map(json.loads, run.stdout.splitlines())}
    assert set(answers) == {"structured_predict", "as_structured_llm"}
    for answer in answers.values():
        assert answer["type"] == "City"
        City.model_validate(answer["value"])
