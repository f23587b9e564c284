"""Soundness on drawn schemas: object and array schemas built at random from the keywords
whose negations and merges the compiler rewrites (not around patternProperties, propertyNames
and constants; several contains; prefixItems and items across allOf), each compiled and
walked on drawn instances. No instance jsonschema rejects may be accepted."""
import random

import jsonschema
import pytest

from conformance import compact, in_schema_order, smollm2, walk
from tamis.constrain import ConstraintError, StructuredOutputsParams, compile_constraint

SUBSCHEMAS = [{"type": "integer"}, {"type": "integer", "maximum": 1}, {"type": "string"}, True, False,
              {"const": 1}, {"minimum": 2}, {"enum": [0, "x"]}]


def _object_schema(rng):
    schema = {"type": "object"}
    if rng.random() < 0.6:
        schema["properties"] = {k: rng.choice(SUBSCHEMAS) for k in rng.sample(["a", "b", "ab"], rng.randint(1, 2))}
    if rng.random() < 0.4:
        schema["required"] = rng.sample(["a", "b"], 1)
    if rng.random() < 0.4:
        schema["patternProperties"] = {rng.choice(["a", "^b", "b$"]): rng.choice(SUBSCHEMAS)}
    if rng.random() < 0.3:
        schema["additionalProperties"] = rng.choice(SUBSCHEMAS[:4])
    if rng.random() < 0.3:
        schema["maxProperties"] = rng.randint(1, 3)
    negated = [{"patternProperties": {rng.choice(["a", "^b", "x"]): rng.choice(SUBSCHEMAS)}},
               {"propertyNames": {"pattern": rng.choice(["^a", "b", "^.$"])}},
               {"propertyNames": {"not": {"pattern": rng.choice(["a", "b"])}}},
               {"const": {k: rng.choice([0, 1]) for k in rng.sample(["a", "b"], rng.randint(0, 2))}}]
    schema["allOf"] = [{"not": part} for part in rng.sample(negated, rng.randint(1, 2))]
    return schema


def _object_instance(rng):
    values = [0, 1, 2, "x", None, {"c": 1}, []]
    return {k: rng.choice(values) for k in rng.sample(["a", "b", "ab", "ba", "c", "x"], rng.randint(0, 3))}


def _array_schema(rng):
    parts = []
    for _ in range(rng.randint(2, 3)):
        roll = rng.random()
        if roll < 0.35:
            parts.append({"contains": rng.choice(SUBSCHEMAS[:3] + SUBSCHEMAS[5:])})
        elif roll < 0.5:
            parts.append({"not": {"const": [rng.choice([0, 1, "x"]) for _ in range(rng.randint(0, 2))]}})
        elif roll < 0.65:
            parts.append({"prefixItems": [rng.choice(SUBSCHEMAS) for _ in range(rng.randint(1, 2))]})
        elif roll < 0.85:
            item = dict(rng.choice([{"const": 1}, {"enum": [1, 2, "x"]}, {"type": "integer"}]))
            if rng.random() < 0.5:
                item["not"] = {"const": rng.choice(["x", 2])}
            parts.append({"items": item})
        else:
            parts.append({"not": {"contains": rng.choice(SUBSCHEMAS[:3])}})
    schema = {"type": "array", "allOf": parts, "items": {"type": ["integer", "string"]}}
    if rng.random() < 0.3:
        schema["maxItems"] = rng.randint(1, 4)
    if rng.random() < 0.5:
        schema["minItems"] = rng.randint(1, 3)
    return schema


def _array_instance(rng):
    return [rng.choice([0, 1, 2, 3, "x", "y"]) for _ in range(rng.randint(0, 4))]


@pytest.mark.parametrize("kind", ["object", "array"])
def test_drawn_schemas_accept_no_invalid_instance(kind):
    draw_schema, draw_instance = {"object": (_object_schema, _object_instance),
                                  "array": (_array_schema, _array_instance)}[kind]
    rng = random.Random(kind)
    info = smollm2()[1]
    compiled_count, wrongly_accepted, valid_accepted = 0, [], 0
    for _ in range(60):
        schema = draw_schema(rng)
        try:
            compiled = compile_constraint(StructuredOutputsParams(json=schema), info)
        except ConstraintError:
            continue
        compiled_count += 1
        validator = jsonschema.Draft202012Validator(schema)
        for _ in range(25):
            value = draw_instance(rng)
            accepted = walk(compiled, compact(in_schema_order(value, schema)))[0]
            valid = validator.is_valid(value)
            valid_accepted += accepted and valid
            if accepted and not valid:
                wrongly_accepted.append((schema, value))
    assert not wrongly_accepted, wrongly_accepted[:3]
    assert compiled_count >= 25 and valid_accepted >= 60      # the draw really exercised them
