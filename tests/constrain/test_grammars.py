"""Lark and GBNF grammars against external vectors (model-free): llama.cpp's grammars must
compile; llama.cpp's GBNF integration cases and the portable Lark vectors must agree."""
import json

import pytest

from conformance import CONFORMANCE, smollm2, walk
from tamis.constrain import GrammarError, StructuredOutputsParams, compile_constraint

GBNF_DIR = CONFORMANCE / "grammars" / "gbnf" / "llama.cpp-grammars"
GBNF_CASES = CONFORMANCE / "grammars" / "gbnf" / "llama.cpp-tests" / "test-grammar-integration.cases.json"
LARK_VECTORS = CONFORMANCE / "grammars" / "lark" / "portable-lark-vectors.json"


def _grammar(text):
    return compile_constraint(StructuredOutputsParams(grammar=text), smollm2()[1])


def _agreement(cases, grammar_key, yes_key, no_key):
    agree = total = 0
    misses = []
    for case in cases:
        compiled = _grammar(case[grammar_key])
        for text, expected in [(s, True) for s in case[yes_key]] + [(s, False) for s in case[no_key]]:
            got, _ = walk(compiled, text)
            total += 1
            agree += got == expected
            if got != expected:
                misses.append((case.get("id") or case.get("desc"), text, expected))
    return agree, total, misses


@pytest.mark.parametrize("path", sorted(GBNF_DIR.glob("*.gbnf")), ids=lambda p: p.name)
def test_every_llama_cpp_grammar_compiles(path):
    compiled = _grammar(path.read_text())
    assert compiled.matcher() is not None


def test_llama_cpp_gbnf_integration_cases_agree():
    cases = [c for c in json.loads(GBNF_CASES.read_text())["cases"] if c["kind"] == "gbnf"]
    assert cases, "no GBNF cases found"
    agree, total, misses = _agreement(cases, "grammar", "passing", "failing")
    print(f"\nGBNF integration cases: {agree}/{total} agree; misses: {misses[:10]}")
    assert agree / total >= 0.98


def test_portable_lark_vectors_agree():
    cases = json.loads(LARK_VECTORS.read_text())["cases"]
    agree, total, misses = _agreement(cases, "grammar", "accepted", "rejected")
    print(f"\nLark vectors: {agree}/{total} agree; misses: {misses[:10]}")
    assert agree / total >= 0.98


def test_gbnf_is_detected_by_its_rule_arrow():
    compiled = _grammar('root ::= "yes" | "no"')
    assert walk(compiled, "yes")[0] and not walk(compiled, "maybe")[0]


@pytest.mark.parametrize("text, fragment", [
    ("not a grammar", "Failed to convert the grammar"),
    ('root ::= "a" missing-rule', "undefined rule"),
    ("root ::= [a-", "unterminated"),
    ("root ::= <[1000]>", "token references"),
    ('start: "a" undefined_rule', "Failed to convert the grammar"),
    ('root ::= root "a"', "cannot derive any finite string"),
])
def test_invalid_grammars_fail_with_a_clear_error(text, fragment):
    with pytest.raises(GrammarError, match=fragment):
        _grammar(text)


def test_escaped_string_inside_another_terminal():
    """Lark pastes common.ESCAPED_STRING's look-behind pattern into the terminals that use it."""
    compiled = _grammar('%import common.ESCAPED_STRING\n'
                        'start: PAIR ("," PAIR)*\n'
                        'PAIR: ESCAPED_STRING ":" ESCAPED_STRING\n')
    for text, ok in [('"a":"b"', True), ('"a\\"":"b","c":"d"', True), ('"a":b', False),
                     ('"a\\":"b"', False), ('"a\nb":"c"', False)]:
        matcher = compiled.matcher()
        assert (matcher.accept_bytes(text.encode()) and matcher.is_complete()) == ok, text
