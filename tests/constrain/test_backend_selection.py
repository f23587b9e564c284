"""structured_outputs_backend: names, defaults and the not-installed error (no optional
package needed; the yardstick backends themselves are tested in test_backend_yardsticks.py),
and the manager's containment of a matcher that fails mid-decode."""
import argparse
from unittest import mock

import numpy as np
import pytest

from tamis.constrain import backends
from tamis.engine.arg_utils import add_engine_args
from tamis.engine.config import EngineConfig


def test_auto_and_default_mean_tamis():
    assert backends.resolve_name("auto") == "tamis"
    assert backends.resolve_name(None) == "tamis"
    assert EngineConfig().structured_outputs_backend == "tamis"


def test_guidance_is_vllms_name_for_llguidance():
    assert backends.resolve_name("guidance") == "llguidance"


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
    assert EngineConfig.from_cli_args(args).structured_outputs_backend == "auto"
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


def _manager_with_two_choices():
    """(tokenizer, info, manager, two requests constrained to "yes"/"no", both compiled)."""
    import time
    from types import SimpleNamespace

    from conformance import smollm2

    from tamis.constrain import StructuredOutputsParams
    from tamis.engine.structured_output import StructuredOutputManager
    tokenizer, info = smollm2()
    manager = StructuredOutputManager(tokenizer, info.vocab_size, None)
    requests = [SimpleNamespace(request_id=rid, sampling_params=SimpleNamespace(
        structured_outputs=StructuredOutputsParams(choice=["yes", "no"]))) for rid in "ab"]
    for request in requests:
        manager.add_request(request)
        while not manager.is_ready(request):
            time.sleep(0.05)
    return tokenizer, info, manager, requests


def test_a_matcher_failing_mid_decode_ends_its_request_alone():
    """A lazy compile step that raises inside fill_bitmask must not escape the manager
    (it would take the engine step, and every other request, down)."""
    from tamis.constrain import ConstraintError
    tokenizer, info, manager, requests = _manager_with_two_choices()

    def explode(bitmask, row):
        raise ConstraintError("constraint too large")
    manager.matcher(requests[0]).fill_bitmask = explode
    for _ in range(2):                       # the failure sticks on later steps
        bitmask = manager.fill_bitmask(requests).numpy()
        allowed = np.unpackbits(bitmask.view(np.uint8), bitorder="little", axis=1).astype(bool)
        assert set(np.flatnonzero(allowed[0])) == set(info.eos_token_ids)
        assert allowed[1].sum() > 0 and not allowed[1][list(info.eos_token_ids)].any()
    assert manager.is_terminated(requests[0]) and "too large" in manager.error(requests[0])
    assert manager.error(requests[1]) is None
    manager.remove_request(requests[0])
    assert manager.error(requests[0]) is None


def test_a_matcher_failing_in_accept_ends_its_request_alone():
    """The same for a lazy step that raises while the matcher advances over a token."""
    from tamis.constrain import ConstraintError
    tokenizer, info, manager, requests = _manager_with_two_choices()

    def explode(token_id):
        raise ConstraintError("constraint too large")
    manager.matcher(requests[0]).accept = explode
    token = tokenizer.encode("yes", add_special_tokens=False)[0]
    assert manager.accept_token(requests[0], token) is False
    assert "too large" in manager.error(requests[0]) and manager.is_terminated(requests[0])
    assert manager.accept_token(requests[1], token) is True and manager.error(requests[1]) is None
    bitmask = manager.fill_bitmask(requests).numpy()
    allowed = np.unpackbits(bitmask.view(np.uint8), bitorder="little", axis=1).astype(bool)
    assert set(np.flatnonzero(allowed[0])) == set(info.eos_token_ids)
