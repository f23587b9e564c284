"""Schemas of the maskbench sample once refused as unsatisfiable, though a value meets each:
a oneOf of enums of arrays (only values in exactly one branch), `not` around
patternProperties / propertyNames (members the object must contain, json_witnesses), and
`not` of an object constant (a missing key, another key, or a value unequal), and two
`contains` in one allOf (an element meeting each). Each compiles,
accepts its witness, and accepts no drawn instance that jsonschema rejects; the constants'
negations are exact on drawn values."""
import itertools
import json
import random

import jsonschema
import pytest

from conformance import CONFORMANCE, compact, in_schema_order, smollm2, walk
from tamis.constrain import StructuredOutputsParams, compile_constraint

SAMPLE = CONFORMANCE / "maskbench-dev-sample" / "Handwritten"


def _draw_key9(rng):
    return [rng.randint(0, 6) for _ in range(rng.randint(0, 3))]


def _draw_object7(rng):
    keys = ["".join(p) for p in itertools.product("abcdx", repeat=2)] + ["a", "abc"]
    return {k: 1 for k in rng.sample(keys, rng.randint(0, 3))}


def _draw_oneofpr4(rng):
    values = [{"c": "99"}, {"c": "1"}, {}, 1, {"c": 99}, {"c": "x99y", "d": 1}]
    return {k: rng.choice(values) for k in rng.sample(["a", "b", "ab", "x", "ba"], rng.randint(0, 3))}


def _chain(n: int, leaf=None):
    """{"a": {"a": ... leaf}} with n keys "a"."""
    value = {} if leaf is None else leaf
    for _ in range(n):
        value = {"a": value}
    return value


def _draw_itc4(rng, depth=0):
    if depth < 2 and rng.random() < 0.6:
        return [_draw_itc4(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return rng.choice([110, 121, 11, 5, "x", None, 220])


def _draw_mod301(rng):
    return _chain(rng.randint(0, 90), rng.choice([None, None, {"b": 1}]))


CASES = {
    # [1, 2] is only in y's enum; [1] is in all three, [2, 4] in x and z, [4, 6] fails `then`
    "key9": ([1, 2], [[1], [2, 4], [4, 6], [5], [1, 2, 3], []], _draw_key9),
    # "da" gives a and d, "cb" b and c; "bc" is forbidden, a third key too many
    "object7": ({"da": 1, "cb": 1}, [{"da": 1}, {"da": 1, "bc": 1}, {"da": 1, "cb": 1, "xy": 1},
                                      {"ab": 1, "cd": 1}], _draw_object7),
    # a key matching "a" whose value has c holding "99"; no key matching "b" (the other branch)
    "oneofpr4": ({"a": {"c": "99"}}, [{"a": {"c": "1"}}, {"a": {}}, {}, {"x": 1},
                                       {"a": {"c": "99"}, "b": {"c": "99"}}], _draw_oneofpr4),
    # an array holding an array with a multiple of 11 from 100 and a non-number; two
    # `contains` meet in one allOf once the other oneOf branch is negated
    "oneofanyofitc4": ([[110, "x"]], [[[110]], [[5]], [[110], [5]], []], _draw_itc4),
    # chains of n nested "a" keys with n odd, n = 1 (mod 3) and n = 4 (mod 5), but for the
    # excluded witness: 19, 49, 79... (the named witness, 29 deep, meets none of the three)
    "mod301": (_chain(19), [_chain(29), _chain(18), _chain(20), _chain(1), {}],
               _draw_mod301),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_satisfiable_schema_compiles_exactly_enough(name):
    schema = json.loads((SAMPLE / f"{name}.json").read_text())["schema"]
    witness, invalid, draw = CASES[name]
    validator = jsonschema.Draft202012Validator(schema)
    assert validator.is_valid(witness)
    compiled = compile_constraint(StructuredOutputsParams(json=schema), smollm2()[1])

    def accepted(value):
        return walk(compiled, compact(in_schema_order(value, schema)))[0]

    assert accepted(witness)
    for value in invalid:
        assert not validator.is_valid(value)
        assert not accepted(value), value
    rng = random.Random(name)
    drawn = [draw(rng) for _ in range(150)]
    wrongly_accepted = [v for v in drawn if accepted(v) and not validator.is_valid(v)]
    assert not wrongly_accepted


EXACT = [
    {"type": "array", "items": {"type": "integer", "maximum": 3}, "not": {"const": [1, 2]}},
    {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
     "not": {"const": {"a": 1}}},
    {"type": "object", "additionalProperties": {"type": "integer", "maximum": 2},
     "not": {"enum": [{"a": 1, "b": 2}, 3]}},
    {"type": "array", "items": {"type": "array", "items": {"type": "integer", "maximum": 2}, "maxItems": 2},
     "maxItems": 2, "not": {"const": [[1], []]}},
    {"allOf": [{"prefixItems": [{"type": "integer"}], "items": {"type": "integer"}},
               {"items": {"maximum": 2}}], "maxItems": 3},
    {"allOf": [{"contains": {"type": "integer", "minimum": 2}}, {"contains": {"type": "integer", "maximum": 2}},
               {"contains": {"type": "string"}}], "items": {"type": ["integer", "string"]}},
    {"allOf": [{"contains": {"const": 1}}, {"contains": {"const": 2}}], "items": {"type": "integer", "maximum": 3},
     "minItems": 3, "maxItems": 3},
    # one element may meet both contains: minItems 2 still needs a second one
    {"type": "array", "allOf": [{"contains": {"type": "integer"}}, {"contains": {"minimum": 2}}],
     "items": {"type": ["integer", "string"]}, "minItems": 2},
    # the items' const checked against the negated contains: 1 is an integer <= 1
    {"type": "array", "items": {"const": 1, "not": {"const": "x"}},
     "not": {"contains": {"type": "integer", "maximum": 1}}},
]


def _draw_value(rng, depth=0):
    roll = rng.random()
    if depth < 2 and roll < 0.3:
        return [_draw_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    if depth < 2 and roll < 0.5:
        return {k: _draw_value(rng, depth + 1) for k in sorted(rng.sample("abc", rng.randint(0, 3)))}
    return rng.choice([0, 1, 2, 3, -1, 1.5, "x", None, True])


def test_negated_integer_type_is_checked_as_the_integers():
    """A value checked against a negated ``integer`` (``_negate`` with ``not_integer``) must
    fail when it is an integer: [1] meets ``contains`` here, so ``not contains`` refuses it."""
    schema = EXACT[-1]
    compiled = compile_constraint(StructuredOutputsParams(json=schema), smollm2()[1])
    assert not walk(compiled, "[1]")[0]
    assert walk(compiled, "[]")[0]


@pytest.mark.parametrize("index", range(len(EXACT)))
def test_constants_contains_and_items_across_allof_exactly(index):
    """Exact: every drawn value is accepted iff jsonschema finds it valid."""
    schema = EXACT[index]
    compiled = compile_constraint(StructuredOutputsParams(json=schema), smollm2()[1])
    validator = jsonschema.Draft202012Validator(schema)
    rng = random.Random(index)
    for _ in range(300):
        value = _draw_value(rng)
        assert walk(compiled, compact(value))[0] == validator.is_valid(value), value
