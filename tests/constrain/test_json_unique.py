"""``uniqueItems`` over enumerated items: enforced exactly where the arrays of distinct values
are few enough to spell out (``MAX_UNIQUE_ORDERINGS``), over unbounded strings beside the
matcher (test_unique_items.py), refused naming the keyword elsewhere.
Every array of a value pool up to four elements long is walked and compared with jsonschema."""
import itertools
import random

import jsonschema
import pytest

from conformance import compact, smollm2, walk
from tamis.constrain import SchemaError, StructuredOutputsParams, compile_constraint
from tamis.constrain.json_arrays import MAX_UNIQUE_ORDERINGS, orderings

SCHEMAS = [
    {"type": "array", "uniqueItems": True, "items": {"enum": ["red", "green", "blue", "cyan", "pink", "gray"]}},
    {"type": "array", "uniqueItems": True, "minItems": 2, "maxItems": 3,
     "items": {"enum": [f"v{i}" for i in range(15)]}},
    {"type": "array", "uniqueItems": True, "items": {"enum": [1, True, "1", None, 0]}},
]


def pool_of(schema) -> list:
    return list(schema["items"]["enum"]) + [2, "other"]


@pytest.mark.parametrize("schema", SCHEMAS, ids=["6 values", "15 values, 2..3 items", "1 and true"])
def test_unique_items_accepts_exactly_the_valid_arrays(schema):
    compiled = compile_constraint(StructuredOutputsParams(json=schema), smollm2()[1])
    validator = jsonschema.Draft202012Validator(schema)
    pool = pool_of(schema)
    rng = random.Random(0)
    samples = [a for size in range(3) for a in itertools.product(pool, repeat=size)]
    samples += [rng.sample(pool, 3) for _ in range(150)] + [rng.choices(pool, k=4) for _ in range(150)]
    wrong = [(a, validator.is_valid(list(a))) for a in samples
             if walk(compiled, compact(list(a)))[0] != validator.is_valid(list(a))]
    assert not wrong, wrong[:5]


def test_seventy_values_two_items_compile_and_refuse_a_repeat():
    schema = {"type": "array", "uniqueItems": True, "maxItems": 2,
              "items": {"enum": [f"name{i}" for i in range(70)]}}
    compiled = compile_constraint(StructuredOutputsParams(json=schema), smollm2()[1])
    assert walk(compiled, '["name3","name69"]')[0]
    assert not walk(compiled, '["name3","name3"]')[0]


@pytest.mark.parametrize("schema", [
    {"type": "array", "uniqueItems": True, "items": {"enum": list(range(7))}},
    {"type": "array", "uniqueItems": True, "items": {"type": "string", "maxLength": 3}},
    {"type": "array", "uniqueItems": True, "items": {"type": "integer"}},
])
def test_unbounded_unique_items_are_refused_naming_the_keyword(schema):
    with pytest.raises(SchemaError, match="uniqueItems"):
        compile_constraint(StructuredOutputsParams(json=schema), smollm2()[1])


def test_the_bound_counts_arrays_of_distinct_values():
    assert orderings(6, None) == 6 + 30 + 120 + 360 + 720 + 720
    assert orderings(70, 2) == 70 + 70 * 69 <= MAX_UNIQUE_ORDERINGS < orderings(7, None)
