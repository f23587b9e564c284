"""``contains`` with ``minContains``/``maxContains``: every array of a pool of values, up to
three elements long (and a stride through four), is walked and compared with jsonschema's
verdict. An invalid array accepted fails the test; valid arrays must all be accepted where
the negation of ``contains`` is exact (the schemas below). Where it cannot be enforced the
refusal names ``contains``."""
import itertools
import random

import jsonschema
import pytest

from conformance import compact, smollm2, walk
from tamis.constrain import SchemaError, StructuredOutputsParams, compile_constraint

POOL = ["x", "y", 1, 5, 7, True, None, 2.5, [1], {"a": 1}]

SCHEMAS = [
    {"type": "array", "contains": {"const": "x"}},
    {"type": "array", "items": {"enum": ["x", "y", 1]}, "contains": {"const": "x"},
     "minContains": 2, "maxContains": 3},
    {"type": "array", "items": {"type": "integer"}, "contains": {"minimum": 5}, "maxItems": 3},
    {"type": "array", "items": {"type": "integer"}, "contains": {"minimum": 5},
     "minContains": 0, "maxContains": 1},
    {"type": "array", "contains": {"type": "string"}, "maxContains": 1},
    {"type": "array", "items": {"type": ["string", "integer"]}, "contains": {"type": "integer"},
     "minItems": 2},
    {"type": "array", "contains": {"const": 1}, "minContains": 0},
    {"type": "array", "contains": False, "minContains": 0},
    {"type": "array", "items": {"enum": ["a", "y", True, 1]}, "uniqueItems": True,
     "contains": {"enum": [1, "y"]}, "maxContains": 1},
    {"type": "array", "contains": {"type": "string"}, "minItems": 2, "maxContains": 2},
    {"type": "array", "contains": {"type": "integer"}, "maxItems": 3, "minContains": 2},
]
# Negated (json_conditionals.negate: an under-approximation): no invalid array accepted.
NEGATED = [
    {"type": "array", "not": {"contains": {"const": "x"}}},
    {"not": {"items": {"type": "integer"}}},
    {"if": {"contains": {"type": "string"}}, "then": {"maxItems": 1}, "else": {"minItems": 2}},
]


def arrays():
    for size in range(4):
        yield from itertools.product(POOL, repeat=size)
    rng = random.Random(1)
    for _ in range(300):
        yield tuple(rng.choice(POOL) for _ in range(4))


def verdicts(schema) -> list:
    """(array, valid per jsonschema, accepted by the compiled schema) for each pool array."""
    compiled = compile_constraint(StructuredOutputsParams(json=schema), smollm2()[1])
    validator = jsonschema.Draft202012Validator(schema)
    return [(a, validator.is_valid(list(a)), walk(compiled, compact(list(a)))[0]) for a in arrays()]


@pytest.mark.parametrize("schema", SCHEMAS, ids=[str(i) for i in range(len(SCHEMAS))])
def test_contains_accepts_exactly_the_valid_arrays(schema):
    wrong = [(a, valid) for a, valid, accepted in verdicts(schema) if accepted != valid]
    assert not wrong, wrong[:5]


@pytest.mark.parametrize("schema", NEGATED, ids=[str(i) for i in range(len(NEGATED))])
def test_negated_contains_and_items_accept_no_invalid_array(schema):
    seen = verdicts(schema)
    assert not [a for a, valid, accepted in seen if accepted and not valid]
    assert any(accepted for _, _, accepted in seen)


@pytest.mark.parametrize("schema, fragment", [
    ({"type": "array", "prefixItems": [{"type": "string"}], "contains": {"const": 1}},
     "not beside prefixItems"),
    ({"type": "array", "contains": {"type": "string"}, "minItems": 100, "maxContains": 100},
     "too many states"),
])
def test_contains_it_cannot_build_is_refused_naming_it(schema, fragment):
    with pytest.raises(SchemaError, match=fragment) as info:
        compile_constraint(StructuredOutputsParams(json=schema), smollm2()[1])
    assert "/contains" in str(info.value) or "'contains'" in str(info.value)


@pytest.mark.parametrize("schema, instances", [
    # a second pattern from allOf is kept as an internal keyword beside the first
    ({"allOf": [{"enum": ["ab", "ax", "b"]}, {"pattern": "^a"}, {"pattern": "b$"}]},
     ["ab", "ax", "b"]),
    # the enum branch of a oneOf without the other branch: "contains" a number above 3 (a
    # negated bound, an internal keyword) filters the values; [3] meets both branches
    ({"type": "array", "oneOf": [{"enum": [[2, 4], [6, 1], [3]]}, {"items": {"maximum": 3}}]},
     [[2, 4], [6, 1], [3], [1]]),
])
def test_enum_values_are_checked_with_internal_keywords(schema, instances):
    compiled = compile_constraint(StructuredOutputsParams(json=schema), smollm2()[1])
    validator = jsonschema.Draft202012Validator(schema)
    accepted = [i for i in instances if walk(compiled, compact(i))[0]]
    assert accepted and all(validator.is_valid(i) for i in accepted), accepted
