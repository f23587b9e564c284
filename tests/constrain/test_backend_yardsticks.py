"""The optional yardstick backends (xgrammar, llguidance) behind the Matcher protocol (constrain/backend.py).

These are third-party libraries used for side-by-side figures, not tamis code: each test is
skipped (importorskip) where its package is not installed."""
import json
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from conformance import compact, smollm2
from tamis.constrain import ConstraintError, StructuredOutputsParams
from tamis.constrain.backends import load_backend

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"},
                                           "n": {"type": "integer", "minimum": 0}},
          "required": ["name", "n"]}


@pytest.fixture(params=["xgrammar", "llguidance"])
def backend(request):
    pytest.importorskip(request.param)
    tokenizer, info = smollm2()
    return load_backend(request.param, tokenizer, info.vocab_size, info)


def _bit(bitmask, row, token):
    return (int(bitmask[row, token // 32]) >> (token % 32)) & 1


def _walk(matcher, text, bitmask=None):
    """Feeds text then EOS; every fed token must be in the mask filled just before it."""
    tokenizer, info = smollm2()
    bitmask = np.zeros((2, info.num_words), np.int32) if bitmask is None else bitmask
    for token in tokenizer.encode(text, add_special_tokens=False) + [info.eos_token_ids[0]]:
        matcher.fill_bitmask(bitmask, 1)
        in_mask = _bit(bitmask, 1, token)
        accepted = matcher.accept(token)
        assert in_mask == accepted, f"mask and accept disagree on token {token}"
        if not accepted:
            return False
    return True


def test_json_schema_accepts_valid_and_refuses_invalid(backend):
    compiled = backend.compile(StructuredOutputsParams(json=SCHEMA))
    assert _walk(compiled.matcher(), compact({"name": "tamis", "n": 3}))
    assert _walk(compiled.matcher(), compact({"name": "a", "n": 1, "extra": True}))  # open object
    assert not _walk(compiled.matcher(), compact({"name": "tamis", "n": -3}))
    assert not _walk(compiled.matcher(), compact({"name": "tamis"}))


def test_eos_only_when_complete_then_finished(backend):
    tokenizer, info = smollm2()
    eos = info.eos_token_ids[0]
    matcher = backend.compile(StructuredOutputsParams(regex=r"ab(c|d)")).matcher()
    assert not matcher.accept(eos)
    for token in tokenizer.encode("abc", add_special_tokens=False):
        assert matcher.accept(token)
    assert matcher.is_complete() and matcher.is_terminated()
    bitmask = torch.zeros((1, info.num_words), dtype=torch.int32)   # torch rows work too
    matcher.fill_bitmask(bitmask, 0)
    assert _bit(bitmask, 0, eos) and int(bitmask.ne(0).sum()) == 1
    assert matcher.accept(eos) and matcher.finished
    matcher.fill_bitmask(bitmask, 0)
    assert not bitmask.any()
    matcher.rollback(1)
    assert not matcher.finished and matcher.is_complete()


def test_rollback_restores_the_state(backend):
    tokenizer, _ = smollm2()
    matcher = backend.compile(StructuredOutputsParams(choice=["yes please", "no thanks"])).matcher()
    yes = tokenizer.encode("yes please", add_special_tokens=False)
    no = tokenizer.encode("no thanks", add_special_tokens=False)
    assert all(matcher.accept(t) for t in yes)
    matcher.rollback(len(yes))
    assert not matcher.is_complete()
    assert all(matcher.accept(t) for t in no) and matcher.is_complete()


def test_grammars_gbnf_and_lark(backend):
    gbnf = 'root ::= "[" item ("," item)* "]"\nitem ::= [0-9]+ | "null"'
    compiled = backend.compile(StructuredOutputsParams(grammar=gbnf))
    assert _walk(compiled.matcher(), "[1,25,null]")
    assert not _walk(compiled.matcher(), "[1,]")
    lark = 'start: "x" NUMBER\nNUMBER: /[0-9]+/'
    compiled = backend.compile(StructuredOutputsParams(grammar=lark))
    assert _walk(compiled.matcher(), "x42")
    assert not _walk(compiled.matcher(), "y42")


def test_compile_errors_name_the_backend(backend):
    with pytest.raises(ConstraintError, match=backend.name):
        backend.compile(StructuredOutputsParams(regex="(unclosed"))


def test_xgrammar_refuses_whitespace_pattern():
    pytest.importorskip("xgrammar")
    tokenizer, info = smollm2()
    backend = load_backend("xgrammar", tokenizer, info.vocab_size, info)
    with pytest.raises(ConstraintError, match="whitespace_pattern"):
        backend.compile(StructuredOutputsParams(json=SCHEMA, whitespace_pattern=r"[ ]?"))


def test_disable_any_whitespace_is_compact(backend):
    compiled = backend.compile(StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=True))
    assert _walk(compiled.matcher(), compact({"name": "x", "n": 1}))
    assert not _walk(compiled.matcher(), '{"name": "x", "n": 1}')


def test_manager_runs_on_the_backend(backend):
    from tamis.engine.structured_output import StructuredOutputManager
    tokenizer, info = smollm2()
    config = SimpleNamespace(structured_outputs_backend=backend.name)
    manager = StructuredOutputManager(tokenizer, info.vocab_size, config)
    params = StructuredOutputsParams(json={"type": "object", "properties": {"answer": {"type": "string"}},
                                           "required": ["answer"], "additionalProperties": False},
                                     disable_any_whitespace=True)
    request = SimpleNamespace(request_id="r", sampling_params=SimpleNamespace(structured_outputs=params))
    free = SimpleNamespace(request_id="f", sampling_params=SimpleNamespace(structured_outputs=None))
    manager.add_request(request)
    for _ in range(600):
        if manager.is_ready(request):
            break
        time.sleep(0.05)
    bitmask = manager.fill_bitmask([request, free])
    assert bitmask.shape == (2, info.num_words) and bool((bitmask[1] == -1).all())
    first = tokenizer.encode('{"', add_special_tokens=False)[0]
    assert _bit(bitmask, 0, first) and not manager.is_terminated(request)
    assert manager.accept_token(request, first)
    forced = manager.jump_forward_tokens(request)        # 'answer":"' is forced
    text = tokenizer.decode([first] + forced)
    assert '{"answer":"'.startswith(text) and len(text) > 2
    manager.remove_request(request)
    assert manager.matcher(request) is None


@pytest.mark.parametrize("name", ["xgrammar", "llguidance"])
def test_llm_generates_with_the_backend(name):
    pytest.importorskip(name)
    torch.set_num_threads(1)
    from tamis.engine.llm import LLM
    from tamis.engine.sampling_params import SamplingParams
    llm = LLM(structured_outputs_backend=name)
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    params = SamplingParams(temperature=0.0, max_tokens=12, structured_outputs=StructuredOutputsParams(
        json=schema, disable_any_whitespace=True))
    out = llm.generate(["Answer as JSON: is the sky blue?"], params, use_tqdm=False)[0].outputs[0]
    assert out.finish_reason == "stop"
    assert json.loads(out.text) in ({"ok": True}, {"ok": False})
