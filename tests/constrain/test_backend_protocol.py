"""The Backend / Grammar / Matcher protocol (constrain/backend.py): every backend implements it,
tamis's own goes through the same compile pool as the others, and the EOS policy is the
manager's, whatever the backend."""
import time
from types import SimpleNamespace

import numpy as np
import pytest

from conformance import smollm2
from tamis.constrain import (Backend, ConstraintCompiler, ConstraintError, Grammar, Matcher,
                             StructuredOutputsParams)
from tamis.constrain.backends import load_backend, make_compiler
from tamis.engine.structured_output import StructuredOutputManager


@pytest.fixture(params=["tamis", "xgrammar", "llguidance"])
def name(request):
    if request.param != "tamis":
        pytest.importorskip(request.param)
    return request.param


def _bit(bitmask, row, token) -> bool:
    return bool((int(bitmask[row, token // 32]) >> (token % 32)) & 1)


def test_backends_implement_the_protocol(name):
    tokenizer, info = smollm2()
    backend = load_backend(name, tokenizer, info.vocab_size, info)
    assert isinstance(backend, Backend) and backend.name == name and backend.info is info
    for params in (StructuredOutputsParams(choice=["yes", "no"]),
                   StructuredOutputsParams(json={"type": "object"}),
                   StructuredOutputsParams(grammar='root ::= "a" root | "b"')):
        grammar = backend.compile(params)
        assert isinstance(grammar, Grammar)
        matcher = grammar.matcher()
        assert isinstance(matcher, Matcher) and matcher.finished is False


def test_a_matcher_missing_a_method_cannot_be_built():
    class Partial(Matcher):
        finished = False

        def accept(self, token_id: int) -> bool:
            return True

    with pytest.raises(TypeError, match="abstract"):
        Partial()


def test_every_backend_goes_through_the_compile_pool(name):
    tokenizer, info = smollm2()
    compiler = make_compiler(name, tokenizer, info.vocab_size, info, time_limit_s=30.0)
    try:
        assert isinstance(compiler, ConstraintCompiler) and compiler.backend.name == name
        first = compiler.submit(StructuredOutputsParams(regex="[0-9]{2}"))
        again = compiler.submit(StructuredOutputsParams(regex="[0-9]{2}"))
        assert again is first and compiler.num_cache_hits == 1
        matcher = first.result(timeout=60).matcher()
        for token in tokenizer.encode("42", add_special_tokens=False):
            assert matcher.accept(token)
        assert matcher.is_complete() and compiler.num_compiles == 1
        with pytest.raises(ConstraintError):
            compiler.compile(StructuredOutputsParams(regex="(unclosed"))
        with pytest.raises(ValueError, match="non-empty"):
            compiler.compile(StructuredOutputsParams(grammar="  "))   # validated by every backend
    finally:
        compiler.shutdown()


def _ready(manager, request):
    for _ in range(600):
        if manager.is_ready(request):
            return request
        time.sleep(0.05)
    raise AssertionError("compile did not finish")


def test_the_manager_applies_the_eos_policy_for_every_backend(name):
    """The engine's stop ids may include a token the grammar reads as text ("x" here): the
    manager allows it only where the output is complete, or always when the request ignores
    EOS; the backend's matcher knows nothing of it."""
    tokenizer, info = smollm2()
    [stop] = tokenizer.encode("x", add_special_tokens=False)
    manager = StructuredOutputManager(tokenizer, info.vocab_size,
                                      SimpleNamespace(structured_outputs_backend=name),
                                      eos_token_ids=(*info.eos_token_ids, stop))
    params = StructuredOutputsParams(regex="[a-z]+")
    requests = [_ready(manager, _request_added(manager, rid, params, ignore_eos))
                for rid, ignore_eos in (("strict", False), ("ignores-eos", True))]
    eos = info.eos_token_ids[0]
    bitmask = manager.fill_bitmask(requests).numpy()
    assert not _bit(bitmask, 0, stop) and not _bit(bitmask, 0, eos)   # nothing written yet
    assert _bit(bitmask, 1, stop)
    [letters] = tokenizer.encode("ab", add_special_tokens=False)
    for request in requests:
        assert manager.accept_token(request, letters)
    bitmask = manager.fill_bitmask(requests).numpy()
    assert _bit(bitmask, 0, stop) and _bit(bitmask, 0, eos)           # complete: may end
    assert np.array_equal(bitmask[0], bitmask[1])
    manager.close()


def _request_added(manager, rid, params, ignore_eos):
    request = SimpleNamespace(request_id=rid, sampling_params=SimpleNamespace(
        structured_outputs=params, ignore_eos=ignore_eos))
    manager.add_request(request)
    return request
