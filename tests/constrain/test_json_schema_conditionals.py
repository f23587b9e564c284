"""Conditional keywords and negation (constrain/json_conditionals.py): valid and invalid JSON
texts walked through the compiled matcher (SmolLM2 tokens). Every text's expected answer is
checked against the jsonschema validator too, so a case can never assert an over-acceptance."""
import json

import jsonschema
import pytest

from conformance import smollm2, walk
from tamis.constrain import ConstraintError, StructuredOutputsParams, compile_constraint


def _accepts(schema, text: str) -> bool:
    compiled = compile_constraint(StructuredOutputsParams(json=schema), smollm2()[1])
    return walk(compiled, text)[0]


def _check(schema, text: str, expected: bool) -> None:
    valid = jsonschema.Draft202012Validator(schema).is_valid(json.loads(text))
    accepted = _accepts(schema, text)
    assert not (accepted and not valid), f"accepted an invalid instance: {text}"
    assert accepted == expected, text
    if expected:
        assert valid                       # the case itself is consistent


KIND = {"type": "object",
        "properties": {"kind": {"enum": ["a", "b"]}, "x": {"type": "integer"}, "y": {"type": "string"}},
        "required": ["kind"],
        "if": {"properties": {"kind": {"const": "a"}}},
        "then": {"required": ["x"]}, "else": {"required": ["y"]}}


@pytest.mark.parametrize("text, ok", [
    ('{"kind":"a","x":1}', True), ('{"kind":"b","y":"q"}', True), ('{"kind":"b","x":1,"y":"z"}', True),
    ('{"kind":"a","y":"q"}', False), ('{"kind":"b","x":1}', False),
    ('{"kind":"\\u0061","y":"q"}', False),      # an escaped "a" still meets the if-schema
])
def test_if_then_else_on_a_discriminator(text, ok):
    _check(KIND, text, ok)


NUMBERS = {"type": "integer", "if": {"minimum": 10}, "then": {"multipleOf": 5}, "else": {"maximum": 3}}


@pytest.mark.parametrize("text, ok", [("10", True), ("15", True), ("3", True), ("-7", True),
                                      ("11", False), ("4", False), ("9", False)])
def test_if_then_else_on_number_bounds(text, ok):
    _check(NUMBERS, text, ok)


REQUIRED_IF = {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "string"}},
               "if": {"required": ["a"]}, "then": {"required": ["b"]}}


@pytest.mark.parametrize("text, ok", [('{"a":"1","b":"2"}', True), ('{"b":"2"}', True), ("{}", True),
                                      ('{"a":"1"}', False)])
def test_if_on_required(text, ok):
    _check(REQUIRED_IF, text, ok)


def test_if_without_then_is_if_or_else():
    schema = {"if": {"type": "string"}, "else": {"type": "integer"}}
    _check(schema, '"x"', True)
    _check(schema, "3", True)
    _check(schema, "true", False)


CONST_NUMBER = {"if": {"const": 1.5}, "then": {"type": "number"}, "else": {"type": "number", "maximum": 0}}


@pytest.mark.parametrize("text, ok", [("1.5", True), ("-2", True), ("1.50", False), ("15e-1", False),
                                      ("2", False)])
def test_negated_number_const_has_one_text_per_value(text, ok):
    # 1.50 and 15e-1 equal 1.5: the else-branch (value != 1.5) must not take them
    _check(CONST_NUMBER, text, ok)


DEPENDENT_REQUIRED = {"type": "object",
                      "properties": {"a": {"type": "string"}, "b": {"type": "string"}},
                      "dependentRequired": {"a": ["b"]}}


@pytest.mark.parametrize("text, ok", [('{"a":"1","b":"2"}', True), ('{"b":"2"}', True), ("{}", True),
                                      ('{"a":"1"}', False)])
def test_dependent_required(text, ok):
    _check(DEPENDENT_REQUIRED, text, ok)


def test_draft7_dependencies_array_and_schema_forms():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
              "dependencies": {"a": ["b"], "b": {"properties": {"a": {"minimum": 5}}}}}
    _check(schema, '{"a":7,"b":1}', True)
    _check(schema, '{"a":1,"b":1}', False)      # b present: a must be >= 5
    _check(schema, '{"a":7}', False)            # a present: b required


DEPENDENT_SCHEMAS = {"type": "object",
                     "properties": {"card": {"type": "string"}, "address": {"type": "string"}},
                     "dependentSchemas": {"card": {"required": ["address"]}}}


@pytest.mark.parametrize("text, ok", [('{"card":"1","address":"x"}', True), ('{"address":"x"}', True),
                                      ('{"card":"1"}', False)])
def test_dependent_schemas(text, ok):
    _check(DEPENDENT_SCHEMAS, text, ok)


RECURSIVE_ONE_OF = {"type": "object", "oneOf": [
    {"properties": {"competencies": {"type": "array", "items": {"$ref": "#"}}}, "required": ["competencies"]},
    {"properties": {"abilities": {"type": "array"}}, "required": ["abilities"]}]}


@pytest.mark.parametrize("text, ok", [('{"competencies":[]}', True), ('{"abilities":[1]}', True),
                                      ('{"competencies":[],"abilities":[]}', False), ("{}", False)])
def test_one_of_with_overlapping_recursive_branches(text, ok):
    _check(RECURSIVE_ONE_OF, text, ok)


NOT_OBJECT = {"type": "object", "properties": {"t": {"type": "string"}, "o": {}},
              "not": {"properties": {"t": {"const": "org"}}, "required": ["t"]}}


@pytest.mark.parametrize("text, ok", [('{"t":"person","o":[1]}', True), ('{"o":{}}', True),
                                      ('{"t":"org"}', False), ('{"t":"\\u006frg"}', False)])
def test_not_around_a_free_form_object(text, ok):
    _check(NOT_OBJECT, text, ok)


def test_not_pattern_on_strings_is_sound():
    schema = {"type": "object", "properties": {"s": {"type": "string", "not": {"pattern": "[^a-z]"}}},
              "additionalProperties": True}
    _check(schema, '{"s":"abc"}', True)
    _check(schema, '{"s":"aB"}', False)


@pytest.mark.parametrize("fmt", ["url", "path", "semver", "topic"])
def test_formats_outside_the_specification_are_annotations(fmt):
    _check({"type": "string", "format": fmt}, '"anything at all"', True)


@pytest.mark.parametrize("fmt", ["idn-email", "idn-hostname"])
def test_specified_formats_tamis_cannot_enforce_are_errors(fmt):
    with pytest.raises(ConstraintError, match=fmt):
        _accepts({"type": "string", "format": fmt}, '"x"')


REGULAR_ONE_OF = {"type": "object", "additionalProperties": {"type": "string"}, "oneOf": [
    {"properties": {"a": {"type": "string"}}, "required": ["a"]},
    {"properties": {"b": {"type": "string"}}, "required": ["b"]}]}


@pytest.mark.parametrize("text, ok", [('{"a":"x"}', True), ('{"b":"y","c":"z"}', True),
                                      ('{"a":"x","b":"y"}', False), ('{"b":"y","a":"x"}', False)])
def test_one_of_overlap_is_judged_on_values_not_texts(text, ok):
    # in schema order, branch a writes b as an extra and branch b writes it first: the texts
    # differ, the values meet both branches
    _check(REGULAR_ONE_OF, text, ok)


def test_one_of_next_to_any_of_and_nested_enums():
    schema = {"anyOf": [{"type": "string"}], "oneOf": [
        {"oneOf": [{"enum": ["a", "b"]}, {"enum": ["c"]}]}, {"enum": ["d"]}]}
    _check(schema, '"c"', True)
    _check(schema, '"d"', True)
    _check(schema, '"e"', False)


MAX_ONE = {"type": "object", "properties": {"x": {"type": "string"}, "m": {"type": "string"}},
           "minProperties": 1, "maxProperties": 1}


@pytest.mark.parametrize("text, ok", [('{"x":"a"}', True), ('{"m":"b"}', True), ('{"z":1}', True),
                                      ('{"x":"a","m":"b"}', False), ('{"x":"a","z":1}', False),
                                      ('{"z":1,"w":2}', False), ("{}", False)])
def test_max_properties_below_the_declared_count(text, ok):
    # each declared property may appear, but never two properties in all
    _check(MAX_ONE, text, ok)
