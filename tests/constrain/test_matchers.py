"""Regex, choice and JSON matchers: language agreement with Python's re, mask soundness,
EOS handling, rollback and jump-forward."""
import random
import re

import numpy as np
import pytest

from conformance import smollm2, walk
from tamis.constrain import StructuredOutputsParams, compile_constraint


def _compile(**kwargs):
    return compile_constraint(StructuredOutputsParams(**kwargs), smollm2()[1])


def _mask(matcher):
    info = smollm2()[1]
    bitmask = np.zeros((2, info.num_words), dtype=np.int32)
    matcher.fill_bitmask(bitmask, 1)
    bits = np.unpackbits(bitmask[1].view(np.uint8), bitorder="little").astype(bool)
    return bits[:info.vocab_size]


@pytest.mark.parametrize("pattern", [
    r"\d{1,3}(\.\d{1,3}){3}", r"(ab|a)*c?", r"[a-z]+@[a-z]+\.(com|org)", r"(?:x|y){2,4}z?",
    r"[^\s]{1,5}", r"-?(0|[1-9][0-9]*)(\.[0-9]+)?", r"(?i:ab)c",
])
def test_regex_language_matches_python_re(pattern):
    compiled = _compile(regex=pattern)
    rng = random.Random(0)
    alphabet = "abcxyz019.@-_ \tAB"
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 9)))
        matcher = compiled.matcher()
        ours = matcher.accept_bytes(text.encode()) and matcher.is_complete()
        assert ours == bool(re.fullmatch(pattern, text)), (pattern, text)


def test_mask_is_sound_and_eos_only_when_complete():
    tokenizer, info = smollm2()
    compiled = _compile(regex=r"[0-9]{2,4}")
    rng = random.Random(1)
    matcher = compiled.matcher()
    for step in range(4):
        allowed = _mask(matcher)
        assert allowed[info.eos_token_ids[0]] == (step >= 2)
        ids = np.flatnonzero(allowed)
        for token in rng.sample(list(ids), min(40, len(ids))):
            probe = compiled.matcher()
            probe.history, probe.state = list(matcher.history), matcher.state
            assert probe.accept(int(token)), tokenizer.decode([int(token)])
        digit = tokenizer.encode(str(step), add_special_tokens=False)[0]
        assert allowed[digit] == (step < 4)
        assert matcher.accept(digit)
    assert matcher.is_terminated()          # 4 digits: only EOS can follow
    assert _mask(matcher).sum() == 1


def test_choice_is_exact_and_terminates():
    compiled = _compile(choice=["Python", "Java", "JavaScript"])
    assert walk(compiled, "Java")[0] and walk(compiled, "JavaScript")[0]
    assert not walk(compiled, "Jav")[0] and not walk(compiled, "Python3")[0]
    tokenizer, info = smollm2()
    matcher = compiled.matcher()
    for token in tokenizer.encode("Python", add_special_tokens=False):
        assert matcher.accept(token)
    assert matcher.is_terminated()


def test_rollback_restores_state():
    tokenizer, _ = smollm2()
    compiled = _compile(json={"type": "object", "properties": {"a": {"type": "integer"}},
                              "required": ["a"], "additionalProperties": False})
    matcher = compiled.matcher()
    tokens = tokenizer.encode('{"a":12}', add_special_tokens=False)
    for token in tokens:
        assert matcher.accept(token)
    assert matcher.is_complete()
    matcher.rollback(2)
    assert not matcher.is_complete()
    for token in tokens[-2:]:
        assert matcher.accept(token)
    assert matcher.is_complete()
    with pytest.raises(ValueError, match="cannot roll back"):
        matcher.rollback(100)


def test_jump_forward_returns_forced_text():
    compiled = _compile(json={"type": "object", "properties": {"name": {"type": "string"}},
                              "required": ["name"], "additionalProperties": False},
                        disable_any_whitespace=True)
    matcher = compiled.matcher()
    assert matcher.jump_forward() == '{"name":"'
    assert matcher.accept_bytes(b'{"name":"x')
    assert matcher.jump_forward() is None


def test_rejected_token_leaves_state_unchanged():
    tokenizer, _ = smollm2()
    compiled = _compile(regex="abc")
    matcher = compiled.matcher()
    bad = tokenizer.encode("x", add_special_tokens=False)[0]
    assert not matcher.accept(bad)
    assert matcher.accept_bytes(b"abc") and matcher.is_complete()


def test_grammar_mask_is_sound():
    """Every token the grammar mask allows is accepted (sampled at each step of a walk)."""
    tokenizer, info = smollm2()
    compiled = _compile(json_object=True)
    rng = random.Random(2)
    matcher = compiled.matcher()
    for token in tokenizer.encode('{"k": [1, {"x": null}], "s": "t"}', add_special_tokens=False):
        ids = np.flatnonzero(_mask(matcher))
        for probe_token in rng.sample(list(ids), min(15, len(ids))):
            probe = compiled.matcher()
            probe.hypotheses, probe.history = matcher.hypotheses, []
            assert probe.accept(int(probe_token)), repr(tokenizer.decode([int(probe_token)]))
        assert matcher.accept(token)
    assert matcher.is_complete()
