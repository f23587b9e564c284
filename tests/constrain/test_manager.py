"""engine/structured_output.py: the manager's contract with the engine (docs/contracts.md)."""
import time
from types import SimpleNamespace

import pytest

from conformance import smollm2
from tamis.constrain import StructuredOutputsParams
from tamis.engine.structured_output import StructuredOutputError, StructuredOutputManager


def _request(rid, **kwargs):
    params = StructuredOutputsParams(**kwargs) if kwargs else None
    return SimpleNamespace(request_id=rid, sampling_params=SimpleNamespace(structured_outputs=params))


def _wait_ready(manager, request):
    for _ in range(600):
        if manager.is_ready(request):
            return
        time.sleep(0.05)
    raise AssertionError("compile did not finish")


def _bit(bitmask, row, token):
    return (int(bitmask[row, token // 32]) >> (token % 32)) & 1


def test_manager_lifecycle():
    tokenizer, info = smollm2()
    manager = StructuredOutputManager(tokenizer, info.vocab_size + 64, None)   # padded logits
    choice = _request("a", choice=["yes", "no"])
    free = _request("b")
    manager.add_request(choice)
    manager.add_request(free)
    _wait_ready(manager, choice)
    assert manager.is_ready(free)
    bitmask = manager.fill_bitmask([choice, free])
    assert bitmask.shape == (2, (info.vocab_size + 64 + 31) // 32)
    eos = info.eos_token_ids[0]
    yes = tokenizer.encode("yes", add_special_tokens=False)[0]
    maybe = tokenizer.encode("maybe", add_special_tokens=False)[0]
    assert _bit(bitmask, 0, yes) and not _bit(bitmask, 0, maybe) and not _bit(bitmask, 0, eos)
    assert _bit(bitmask, 1, maybe) and _bit(bitmask, 1, eos)       # unconstrained row: all ones
    assert not manager.is_terminated(choice)
    assert not manager.accept_token(choice, maybe)
    for token in tokenizer.encode("yes", add_special_tokens=False):
        assert manager.accept_token(choice, token)
    assert manager.is_terminated(choice)                            # EOS may be sampled now
    assert _bit(manager.fill_bitmask([choice]), 0, eos)
    assert manager.fill_bitmask([free]) is None
    manager.remove_request(choice)


def test_compile_failure_fails_only_that_request():
    tokenizer, info = smollm2()
    manager = StructuredOutputManager(tokenizer, info.vocab_size, None)
    bad = _request("bad", regex="(a)\\1")
    good = _request("good", regex="[0-9]+")
    manager.add_request(bad)
    manager.add_request(good)
    _wait_ready(manager, good)
    with pytest.raises(StructuredOutputError, match="backreferences"):
        for _ in range(600):
            if manager.is_ready(bad):
                break
            time.sleep(0.05)


def test_jump_forward_tokens_are_accepted_and_hold_back_the_last():
    tokenizer, info = smollm2()
    manager = StructuredOutputManager(tokenizer, info.vocab_size, None)
    schema = {"type": "object", "properties": {"answer": {"type": "string"}},
              "required": ["answer"], "additionalProperties": False}
    request = _request("j", json=schema, disable_any_whitespace=True)
    manager.add_request(request)
    _wait_ready(manager, request)
    forced = manager.jump_forward_tokens(request)
    text = tokenizer.decode(forced)
    assert forced and '{"answer":"'.startswith(text) and len(text) < len('{"answer":"')
    matcher = manager.matcher(request)
    assert matcher.accept_bytes('{"answer":"'[len(text):].encode())


def test_unknown_backend_is_refused():
    tokenizer, info = smollm2()
    with pytest.raises(ValueError, match="outlines"):
        StructuredOutputManager(tokenizer, info.vocab_size,
                                SimpleNamespace(structured_outputs_backend="outlines"))
