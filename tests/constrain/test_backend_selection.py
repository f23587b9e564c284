"""structured_outputs_backend: names, defaults and the not-installed error (no optional
package needed; the yardstick backends themselves are tested in test_backend_yardsticks.py)."""
import argparse
from unittest import mock

import pytest

from tamis.constrain import backends
from tamis.engine.arg_utils import add_engine_args
from tamis.engine.config import EngineConfig


def test_auto_and_default_mean_tamis():
    assert backends.resolve_name("auto") == "tamis"
    assert backends.resolve_name(None) == "tamis"
    assert EngineConfig().structured_outputs_backend == "tamis"


def test_unknown_name_names_the_flag():
    with pytest.raises(ValueError, match="--structured-outputs-backend.*outlines"):
        EngineConfig(structured_outputs_backend="outlines")


def test_missing_package_says_how_to_install():
    with mock.patch("importlib.util.find_spec", return_value=None):
        with pytest.raises(ValueError, match="pip install llguidance"):
            EngineConfig(structured_outputs_backend="llguidance")
        assert backends.check_installed("tamis") == "tamis"   # ours needs nothing


def test_cli_flag_reaches_the_config():
    parser = add_engine_args(argparse.ArgumentParser())
    args = parser.parse_args(["--structured-outputs-backend", "auto"])
    assert args.structured_outputs_backend == "auto"
    with pytest.raises(SystemExit):
        parser.parse_args(["--structured-outputs-backend", "outlines"])


def test_tamis_backend_compiles_through_the_common_interface():
    from conformance import smollm2

    from tamis.constrain import StructuredOutputsParams
    tokenizer, info = smollm2()
    backend = backends.load_backend("auto", tokenizer, info.vocab_size, info)
    matcher = backend.compile(StructuredOutputsParams(choice=["yes", "no"])).matcher()
    assert not matcher.accept(tokenizer.encode("maybe", add_special_tokens=False)[0])
    for token in tokenizer.encode("yes", add_special_tokens=False):
        assert matcher.accept(token)
    assert matcher.is_complete()
