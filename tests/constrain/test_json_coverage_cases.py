"""Schema shapes compiled exactly (each compared with jsonschema on drawn instances): allOf of
several anyOf/oneOf lists, allOf of different propertyNames, additionalProperties in one allOf
branch beside patternProperties in another (and names matching the closed branch's
patterns), oneOf over closed objects (negated
additionalProperties), patterns asking for '"' or '\\', and the formats iri, uri-template
and regex (a documented regular subset: whatever it accepts compiles), and draft 4's plain-name
``id`` fragments as $ref targets."""
import json
import random
import re

import jsonschema
import pytest

from conformance import compact, in_schema_order, smollm2, walk
from tamis.constrain import StructuredOutputsParams, compile_constraint


def compiled(schema):
    return compile_constraint(StructuredOutputsParams(json=schema), smollm2()[1])


def disagreements(schema, instances) -> list:
    """Instances where the walk and jsonschema disagree (formats asserted)."""
    c = compiled(schema)
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())
    return [(v, validator.is_valid(v)) for v in instances
            if walk(c, compact(in_schema_order(v, schema)))[0] != validator.is_valid(v)]


KEYS_AND_VALUES = (["a", "b", "c", "x-1"], [0, 1, "s", None, True])


def drawn_objects(rng: random.Random, count: int) -> list:
    keys, values = KEYS_AND_VALUES
    out = [{}]
    for _ in range(count):
        chosen = sorted(rng.sample(keys, rng.randint(1, 3)))
        out.append({k: rng.choice(values) for k in chosen})
    return out


ALL_OF_ALTERNATIVES = [
    {"type": "object", "allOf": [
        {"oneOf": [{"required": ["a"]}, {"required": ["b"]}]},
        {"oneOf": [{"properties": {"a": {"type": "integer"}}, "required": ["a"]},
                   {"required": ["c"]}]}]},
    {"type": "object", "allOf": [
        {"anyOf": [{"required": ["a"]}, {"required": ["b"]}]},
        {"anyOf": [{"required": ["c"]}, {"properties": {"a": {"const": 1}}}]},
        {"anyOf": [{"properties": {"b": {"type": "string"}}}, {"required": ["x-1"]}]}]},
]


@pytest.mark.parametrize("schema", ALL_OF_ALTERNATIVES, ids=["two oneOf", "three anyOf"])
def test_all_of_several_alternative_lists_is_exact(schema):
    schema = {**schema, "properties": {k: {} for k in KEYS_AND_VALUES[0]}}
    wrong = disagreements(schema, drawn_objects(random.Random(1), 120))
    assert not wrong, wrong[:5]


def test_all_of_two_property_names_needs_both():
    schema = {"type": "object", "allOf": [{"propertyNames": {"maxLength": 1}},
                                          {"propertyNames": {"pattern": "^[a-b]"}}]}
    wrong = disagreements(schema, drawn_objects(random.Random(2), 80))
    assert not wrong, wrong[:5]


@pytest.mark.parametrize("schema", [
    {"type": "object", "allOf": [
        {"properties": {"a": {}}, "additionalProperties": {"type": "integer"}},
        {"patternProperties": {"^x": {"minimum": 1}}}]},
    {"type": "object", "allOf": [
        {"properties": {"b": {"type": "string"}}, "patternProperties": {"^[ac]": {}},
         "additionalProperties": False},
        {"patternProperties": {"^x": {"type": "integer"}}}]},
], ids=["integer extras", "closed with its own patterns"])
def test_additional_properties_govern_the_other_branch_patterns(schema):
    wrong = disagreements(schema, drawn_objects(random.Random(3), 120))
    assert not wrong, wrong[:5]


@pytest.mark.parametrize("schema", [
    {"allOf": [{"type": "object", "patternProperties": {"^[ab]": {"type": "integer"}},
                "additionalProperties": False}, {"required": ["a"]}]},
    {"allOf": [{"type": "object", "patternProperties": {"^[ab]": {}}, "additionalProperties": False},
               {"properties": {"b": {"type": "string"}, "c": {}}, "required": ["b"]}]},
], ids=["required name", "declared names"])
def test_a_name_matching_the_closed_branch_patterns_is_not_additional(schema):
    """Such names were given the closed branch's additionalProperties (false): the schema
    read as unsatisfiable (maskbench Github_medium/o10566, Handwritten/dep8)."""
    instances = drawn_objects(random.Random(5), 120)
    assert any(jsonschema.Draft202012Validator(schema).is_valid(v) for v in instances)
    wrong = disagreements(schema, instances)
    assert not wrong, wrong[:5]


def test_one_of_closed_objects_keeps_each_branch_alone():
    schema = {"type": "object", "oneOf": [
        {"properties": {"a": {"type": "string"}}, "additionalProperties": False},
        {"properties": {"b": {"type": "array"}}, "additionalProperties": False}]}
    instances = drawn_objects(random.Random(4), 100) + [{"a": "x"}, {"b": []}, {"a": "x", "b": []}]
    wrong = disagreements(schema, instances)
    assert not wrong, wrong[:5]
    assert walk(compiled(schema), '{"a":"x"}')[0]


@pytest.mark.parametrize("value", ['\\d+/1', 'a"b', '\\"', "plain", "\\", '"'])
def test_patterns_with_quote_and_backslash_use_json_escapes(value):
    schema = {"type": "string", "pattern": '^(\\\\d\\+/[0-9]|a"b|\\\\"|plain)$', "maxLength": 5}
    assert not disagreements(schema, [value])


FORMAT_CASES = {
    "iri": (["http://ex.ample/päth?q=ü#frag", "urn:isbn:0451450523", "https://例え.jp/"],
            ["no scheme", "http://a b", "http://ex.ample/%zz"]),
    "uri-template": (["http://example.com/{user}/{+path}{?q,lang}", "/v1/{id:3}/x{.fmt*}"],
                     ["/{unclosed", "/{a b}", "/{}"]),
}


@pytest.mark.parametrize("fmt", sorted(FORMAT_CASES))
def test_iri_and_uri_template_formats(fmt):
    c = compiled({"type": "string", "format": fmt})
    good, bad = FORMAT_CASES[fmt]
    assert all(walk(c, json.dumps(v, ensure_ascii=False))[0] for v in good)
    assert not any(walk(c, json.dumps(v, ensure_ascii=False))[0] for v in bad)


def test_regex_format_accepts_only_valid_regexes():
    c = compiled({"type": "string", "format": "regex"})
    pieces = ["a", "^", "$", "[", "]", "(", ")", "*", "+", "?", "{2}", "{2,}", "-", ".", "[a-z]",
              "[^0-9_]", " ", "|", "{", "}", ":", "z-a"]
    rng = random.Random(6)
    texts = ["".join(rng.choice(pieces) for _ in range(rng.randint(0, 5))) for _ in range(300)]
    texts += ["^[a-z][a-z0-9_-]*$", "[a-z]+", "a{3}b?", "^v[0-9]+.[0-9]+$"]
    accepted = [t for t in dict.fromkeys(texts) if walk(c, json.dumps(t))[0]]
    for text in accepted:
        re.compile(text)            # valid for Python's re (and the subset for ECMAScript)
    assert {"^[a-z][a-z0-9_-]*$", "[a-z]+", "a{3}b?"} <= set(accepted)
    assert "(a" not in accepted and "a**" not in accepted


def test_draft4_plain_name_ids_are_anchors():
    schema = {"$schema": "http://json-schema.org/draft-04/schema#", "type": "object",
              "definitions": {"gate": {"id": "#gate", "type": "integer"}},
              "properties": {"g": {"$ref": "#gate"}}}
    c = compiled(schema)
    assert walk(c, '{"g":3}')[0]
    assert not walk(c, '{"g":"3"}')[0]


MIN_PROPERTIES = [
    {"type": "object", "properties": {k: {} for k in "abc"}, "additionalProperties": False,
     "minProperties": 2},
    {"type": "object", "properties": {k: {} for k in "abc"}, "required": ["b"],
     "additionalProperties": False, "minProperties": 3},
    {"type": "object", "properties": {k: {} for k in "abc"}, "required": ["a"],
     "additionalProperties": False, "minProperties": 2, "maxProperties": 2},
    {"type": "object", "properties": {k: {} for k in "abcx"}, "additionalProperties": False,
     "minProperties": 2, "maxProperties": 3},
]


@pytest.mark.parametrize("schema", MIN_PROPERTIES,
                         ids=["two of three", "three with one required", "exactly two", "two to three"])
def test_min_properties_over_declared_members_is_exact(schema):
    objects = drawn_objects(random.Random(2), 150)
    objects = [{k.replace("x-1", "x"): v for k, v in o.items()} for o in objects]
    wrong = disagreements(schema, objects)
    assert not wrong, wrong[:5]


def test_min_properties_counts_one_extra_member():
    """Open object, minProperties 3 over two declared members: reached by both declared
    members and one extra, never by repeated extras (their keys might repeat, which JSON
    collapses); an object that needs two extras is not emitted (sound)."""
    schema = {"type": "object", "properties": {"a": {}, "b": {}}, "minProperties": 3}
    c = compiled(schema)
    validator = jsonschema.Draft202012Validator(schema)
    for value in drawn_objects(random.Random(3), 150) + [{"a": 1, "c": 2, "d": 3}]:
        accepted = walk(c, compact(in_schema_order(value, schema)))[0]
        declared = sum(k in value for k in "ab")
        assert accepted == (validator.is_valid(value) and declared >= 2), value
    assert not walk(c, '{"a":1,"x":2,"x":3}')[0]


@pytest.mark.parametrize("schema", [
    {"type": "object", "minProperties": 2},
    {"type": "object", "properties": {"a": {}}, "minProperties": 3, "maxProperties": 4},
    {"type": "object", "patternProperties": {"^[a-d]$": {}}, "additionalProperties": False,
     "minProperties": 2}])
def test_min_properties_needing_two_extras_is_refused_not_called_unsatisfiable(schema):
    with pytest.raises(Exception, match="minProperties .* two or more additional properties"):
        compiled(schema)


def test_ref_fragments_are_percent_decoded_before_the_pointer():
    """RFC 6901 section 6: ``%5B`` in a $ref fragment is ``[``, then ``~1`` is ``/``."""
    schema = {"type": "object", "patternProperties": {"^[a-z]+/x$": {"type": "integer"}},
              "properties": {"n": {"$ref": "#/patternProperties/%5E%5Ba-z%5D+~1x$"}},
              "required": ["n"], "additionalProperties": False}
    wrong = disagreements(schema, [{"n": 1}, {"n": "s"}, {"n": 2.5}, {}])
    assert not wrong, wrong


def test_counted_arrays_of_large_items_keep_the_item_a_nonterminal():
    """maxItems 100 of objects with 200-character strings: 100 copies of the item would be
    ~150,000 automaton states (once refused as too large); the item stays one grammar rule
    and the count stays exact."""
    item = {"type": "object", "properties": {"k": {"type": "string", "pattern": "^[a-z]{1,200}$"},
                                             "v": {"type": "string", "maxLength": 200}},
            "required": ["k", "v"], "additionalProperties": False}
    schema = {"type": "array", "items": item, "minItems": 2, "maxItems": 100}
    c = compiled(schema)
    assert c.kind == "grammar", c.kind
    element = {"k": "abc", "v": "x" * 200}
    instances = [[], [element], [element] * 2, [element] * 100, [element] * 101,
                 [element, {"k": "a" * 201, "v": ""}], [element, {"k": "ab", "v": "y" * 201}]]
    wrong = disagreements(schema, instances)
    assert not wrong, [(len(v), ok) for v, ok in wrong]


@pytest.mark.parametrize("text, ok", [
    ('{"a":1}', True), ('{"x":"s"}', True), ('{"\\u0061":"s"}', False), ('{"\\u0061":1}', False),
    ('{"\\u0062":"s"}', True), ('{"b\\/c":"s"}', False), ('{"b\\/d":"s"}', True),
    ('{"\\u00E9t\\u00e9":"s"}', False), ('{"\\ud83d\\ude00":"s"}', False), ('{"\\ud83d\\ude01":"s"}', True)])
def test_additional_keys_never_decode_to_a_declared_name(text, ok):
    """An escaped spelling of a declared name is that name (JSON decodes it): it never takes
    additionalProperties' schema (declared names themselves are written plainly)."""
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b/c": {"type": "integer"},
                                               "été": {"type": "integer"}, "😀": {"type": "integer"}},
              "additionalProperties": {"type": "string"}}
    assert walk(compiled(schema), text)[0] == ok
    assert jsonschema.Draft202012Validator(schema).is_valid(json.loads(text)) or not ok


def test_a_branch_needing_two_extras_is_left_out_not_the_schema():
    schema = {"anyOf": [{"type": "object", "minProperties": 2},
                        {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}]}
    c = compiled(schema)
    assert walk(c, '{"a":1}')[0] and walk(c, '{"a":1,"b":2}')[0]
    assert not walk(c, '{"b":1,"c":2}')[0]     # valid, but only through the left-out branch
    assert not walk(c, '{"b":1}')[0]           # invalid
