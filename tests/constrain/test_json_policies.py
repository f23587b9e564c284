"""The documented JSON policies (constrain/json_schema.py docstring), each checked."""
import pytest

from conformance import walk
from tamis.constrain import StructuredOutputsParams, compile_constraint
from conformance import smollm2

OBJ = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
       "required": ["a"]}


def _ok(text, **kwargs):
    return walk(compile_constraint(StructuredOutputsParams(**kwargs), smollm2()[1]), text)[0]


def test_property_order_is_schema_order():
    assert _ok('{"a":1,"b":"x"}', json=OBJ)
    assert not _ok('{"b":"x","a":1}', json=OBJ)


def test_additional_properties_allowed_by_default_after_declared_ones():
    assert _ok('{"a":1,"zz":[1,{"q":null}]}', json=OBJ)
    assert not _ok('{"a":1,"a":2}', json=OBJ)               # a declared name is not "additional"
    assert not _ok('{"a":1,"zz":2}', json=OBJ, disable_additional_properties=True)


def test_whitespace_is_bounded_by_default():
    assert _ok('{\n  "a": 1,\n  "b": "x"\n}', json=OBJ)
    assert not _ok('{"a":' + " " * 21 + "1}", json=OBJ)
    assert not _ok('{"a":\n\n1}', json=OBJ)
    assert not _ok(' {"a":1}', json=OBJ)                    # nothing before the value


def test_disable_any_whitespace_is_compact():
    assert _ok('{"a":1}', json=OBJ, disable_any_whitespace=True)
    assert not _ok('{"a": 1}', json=OBJ, disable_any_whitespace=True)


def test_whitespace_pattern_replaces_the_default():
    assert _ok('{"a":\t1}', json=OBJ, whitespace_pattern=r"\t?")
    assert not _ok('{"a": 1}', json=OBJ, whitespace_pattern=r"\t?")


@pytest.mark.parametrize("text, ok", [("12", True), ("-3", True), ("0", True), ("-0", False),
                                      ("1.0", False), ("01", False), ("1e3", False)])
def test_integers_are_canonical(text, ok):
    assert _ok(text, json={"type": "integer"}) == ok


@pytest.mark.parametrize("text, ok", [("0.5", True), ("1e-3", True), ("-0.25", True), (".5", False),
                                      ("0.50", True), ("1.", False)])
def test_numbers_follow_json_grammar(text, ok):
    assert _ok(text, json={"type": "number"}) == ok


@pytest.mark.parametrize("text, ok", [("0.5", True), ("0.49", False), ("2", True), ("2.0001", False),
                                      ("1e0", False)])
def test_number_bounds_are_exact_and_without_exponent(text, ok):
    assert _ok(text, json={"type": "number", "minimum": 0.5, "maximum": 2}) == ok


def test_patterned_strings_never_use_escapes():
    schema = {"type": "string", "pattern": "^a.c$"}
    assert _ok('"abc"', json=schema)
    assert not _ok('"a\\u0062c"', json=schema)


def test_one_of_is_exclusive():
    schema = {"oneOf": [{"type": "integer", "minimum": 5}, {"type": "integer", "maximum": 10}]}
    assert _ok("3", json=schema) and _ok("12", json=schema)
    assert not _ok("7", json=schema)                        # matches both branches


def test_long_max_length_is_capped_soundly():
    schema = {"type": "string", "maxLength": 4096}
    assert _ok('"' + "x" * 256 + '"', json=schema)
    assert not _ok('"' + "x" * 257 + '"', json=schema)      # valid, but beyond the cap


def test_all_of_multiple_of_steps_combine_to_their_least_common_multiple():
    """allOf of multipleOf 2 and 3 (and an integer step 5 via oneOf): multiples of 30 only."""
    from conformance import smollm2, walk
    from tamis.constrain import StructuredOutputsParams, compile_constraint
    compiled = compile_constraint(StructuredOutputsParams(json={
        "allOf": [{"multipleOf": 2}], "anyOf": [{"multipleOf": 3}],
        "oneOf": [{"multipleOf": 5}]}), smollm2()[1])
    assert [t for t in ("2", "3", "5", "6", "10", "15", "30", "60", "45") if walk(compiled, t)[0]] == ["30", "60"]
    decimal = compile_constraint(StructuredOutputsParams(json={
        "allOf": [{"multipleOf": 0.5}, {"multipleOf": 0.3}]}), smollm2()[1])
    assert walk(decimal, "1.5")[0] and walk(decimal, "3")[0] and not walk(decimal, "0.5")[0]


def test_unicode_escapes_name_whole_code_points():
    string = {"type": "string"}
    assert _ok(r'"\u00e9\ud83d\ude00"', json=string)
    assert not _ok(r'"\ud83d"', json=string)                 # a lone high surrogate
    assert not _ok(r'"\ude00x"', json=string)                # a lone low surrogate
    assert not _ok(r'"\ud83d\u0041"', json=string)           # high surrogate, then no low one
    # a pair is one character, as JSON Schema counts them
    assert not _ok(r'"\ud83d\ude00"', json={"type": "string", "minLength": 2})
    assert _ok(r'"\ud83d\ude00"', json={"type": "string", "maxLength": 1})
