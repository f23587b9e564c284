"""Bad constraints fail at compile time, fast, with a message naming the problem."""
import json
import time

import pytest

from conformance import smollm2
from tamis.constrain import (CompileTimeout, ConstraintCompiler, ConstraintError, RegexError,
                             SchemaError, StructuredOutputsParams, compile_constraint)
from tamis.constrain.backends.tamis_backend import TamisBackend


def _compile(**kwargs):
    return compile_constraint(StructuredOutputsParams(**kwargs), smollm2()[1])


@pytest.mark.parametrize("kwargs, error, fragment", [
    ({"json": '{"type": "object", "properties": '}, ValueError, "not valid JSON"),
    ({"json": {"type": "strin"}}, SchemaError, "unknown type 'strin'"),
    ({"json": {"type": "object", "properties": {"a": {"unevaluatedItems": False}}}}, SchemaError,
     "'unevaluatedItems' is not supported.*#/properties/a/unevaluatedItems"),
    ({"json": {"type": "array", "uniqueItems": True}}, SchemaError, "uniqueItems"),
    ({"json": {"type": "string", "format": "idn-email"}}, SchemaError, "format 'idn-email'"),
    ({"json": {"$ref": "http://example.com/other.json"}}, SchemaError, "remote \\$ref"),
    ({"regex": "(a)\\1"}, RegexError, "backreferences"),
    ({"regex": "(?<=a)b"}, RegexError, "look-behind"),
    ({"regex": "(a(?=b))c"}, RegexError, "look-ahead inside a group"),
    ({"regex": "a(b"}, RegexError, "missing '\\)'"),
    ({"regex": "[z-a]"}, RegexError, "end before start"),
    ({"choice": []}, ValueError, "non-empty list"),
    ({"grammar": "not a grammar"}, ValueError, "Failed to convert the grammar"),
    ({"json": False}, SchemaError, "accepts no value"),
])
def test_bad_constraints_raise_clear_errors(kwargs, error, fragment):
    with pytest.raises(error, match=fragment):
        _compile(**kwargs)


def test_two_constraints_at_once():
    with pytest.raises(ValueError, match="only use one kind"):
        StructuredOutputsParams(json={"type": "string"}, regex="a")


def test_deeply_nested_schema_is_refused_quickly():
    schema = {"type": "string"}
    for _ in range(1500):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    start = time.monotonic()
    with pytest.raises(SchemaError, match="nesting deeper"):
        _compile(json=schema)
    assert time.monotonic() - start < 5


def test_recursion_limit_is_a_clear_error_not_a_crash(monkeypatch):
    """A schema nesting the compiler's recursive passes past Python's limit compiles again on
    a deep stack; past the deep stack's limit too, it is a ConstraintError, as any refusal.
    With the deep stack's limit no higher than the normal one, 300 levels hit both here."""
    from tamis.constrain import compiler as compiler_module
    schema = {"type": "string"}
    for _ in range(300):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    info = smollm2()[1]
    with monkeypatch.context() as patch:
        patch.setattr(compiler_module, "DEEP_RECURSION_LIMIT", 100)
        with pytest.raises(ConstraintError, match="too deeply to compile"):
            compile_constraint(StructuredOutputsParams(json=schema), info)
    assert compile_constraint(StructuredOutputsParams(json=schema), info) is not None


def test_huge_enum_is_refused_quickly():
    start = time.monotonic()
    with pytest.raises(SchemaError, match="enum with 100001 values"):
        _compile(json={"enum": list(range(100_001))})
    assert time.monotonic() - start < 5


def test_huge_repetition_is_refused():
    # (200 strings of up to 256 characters compile: the item stays one grammar rule)
    with pytest.raises(ConstraintError, match="too large"):
        _compile(json={"type": "string", "pattern": "^([a-z]{1,5000}-){100}$"})


def test_time_limit_fails_the_compile_not_the_process():
    compiler = ConstraintCompiler(TamisBackend(smollm2()[1]), time_limit_s=0.001)
    params = StructuredOutputsParams(regex="(a|b|c|d){1,3000}x{1,3000}")
    future = compiler.submit(params)
    with pytest.raises((CompileTimeout, ConstraintError)):
        future.result(timeout=30)
    ok = compiler.submit(StructuredOutputsParams(regex="ok")).result(timeout=30)
    assert ok.matcher().accept_bytes(b"ok")
    compiler.shutdown()


def test_an_enum_of_ten_thousand_strings_compiles_within_the_limit():
    values = [f"value-{i}" for i in range(10_000)]
    compiler = ConstraintCompiler(TamisBackend(smollm2()[1]), time_limit_s=10.0)
    compiled = compiler.submit(StructuredOutputsParams(json={"enum": values})).result()
    for text, ok in [('"value-9999"', True), ('"value-0"', True), ('"value-10000"', False)]:
        matcher = compiled.matcher()
        assert (matcher.accept_bytes(text.encode()) and matcher.is_complete()) == ok, text
    compiler.shutdown()


def test_unique_items_enforced_where_bounded():
    compiled = _compile(json={"type": "array", "items": {"enum": ["a", "b", 1, True]},
                              "uniqueItems": True, "minItems": 1})
    for text, ok in [('["a",1]', True), ('[1,true,"b","a"]', True), ('["a","a"]', False),
                     ('[1,1]', False), ('[]', False), ('[true,1,true]', False)]:
        matcher = compiled.matcher()
        assert (matcher.accept_bytes(text.encode()) and matcher.is_complete()) == ok, text
    one = _compile(json={"type": "array", "items": {"type": "string"}, "uniqueItems": True,
                         "maxItems": 1}).matcher()
    assert one.accept_bytes(b'["x"]') and one.is_complete()
    with pytest.raises(SchemaError, match="uniqueItems.*enforced only.*maxLength"):
        _compile(json={"type": "array", "items": {"type": "string", "format": "email"},
                       "uniqueItems": True})


def test_anchors_inside_a_group_that_is_a_whole_branch():
    """maskbench's '^$|(^(?:\\S+\\s+){0,19}\\S+$)': the group's anchors are the branch's."""
    import re
    pattern = r"^$|(^(?:\S+\s+){0,19}\S+$)"
    compiled = _compile(json={"type": "string", "pattern": pattern})
    for text in ["", "one", "one two", " one", "one ", "a b c d"]:
        matcher = compiled.matcher()
        accepted = matcher.accept_bytes(json.dumps(text).encode()) and matcher.is_complete()
        assert accepted == (re.search(pattern, text) is not None), text
    inner = _compile(regex="(^a)b").matcher()       # an anchor inside a group (regex_anchors)
    assert inner.accept_bytes(b"ab") and inner.is_complete()
