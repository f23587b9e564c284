"""Schemas nested 300 levels deep (arrays, objects, $ref chains) compile within the default
time limit, on the compiler's pool as on a plain call, and still enforce the innermost schema:
a valid 300-deep instance is accepted and an invalid one refused."""
import sys
import time

import pytest

from conformance import smollm2, walk
from tamis.constrain import ConstraintCompiler, SchemaError, StructuredOutputsParams, compile_constraint
from tamis.constrain.backends.tamis_backend import TamisBackend
from tamis.constrain.compiler import DEFAULT_TIME_LIMIT_S

DEPTH = 300


def nested_arrays(depth: int, **bounds) -> dict:
    schema = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema, **bounds}
    return schema


def nested_objects(depth: int, required: bool) -> dict:
    schema = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}, "additionalProperties": False,
                  **({"required": ["a"]} if required else {})}
    return schema


def ref_chain(depth: int) -> dict:
    defs = {f"d{i}": {"type": "object", "properties": {"n": {"$ref": f"#/$defs/d{i + 1}"}},
                      "required": ["n"]} for i in range(depth)}
    defs[f"d{depth}"] = {"type": "integer"}
    return {"$defs": defs, "$ref": "#/$defs/d0"}


CASES = {
    "arrays": (nested_arrays(DEPTH), "[" * DEPTH + "1" + "]" * DEPTH,
               "[" * DEPTH + "1.5" + "]" * DEPTH),
    "bounded arrays": (nested_arrays(DEPTH, minItems=1, maxItems=2), "[" * DEPTH + "1,2" + "]" * DEPTH,
                       "[" * DEPTH + "1,2,3" + "]" * DEPTH),
    "required properties": (nested_objects(DEPTH, True), '{"a":' * DEPTH + '"x"' + "}" * DEPTH,
                            '{"a":' * DEPTH + "1" + "}" * DEPTH),
    "optional properties": (nested_objects(DEPTH, False),
                            '{"a":' * (DEPTH - 1) + "{}" + "}" * (DEPTH - 1),
                            '{"a":' * DEPTH + "1" + "}" * DEPTH),
    "$ref chain": (ref_chain(DEPTH), '{"n":' * DEPTH + "1" + "}" * DEPTH,
                   '{"n":' * DEPTH + '"1"' + "}" * DEPTH),
}


@pytest.mark.parametrize("name", CASES)
def test_300_levels_compile_and_enforce_the_innermost_schema(name):
    schema, valid, invalid = CASES[name]
    compiler = ConstraintCompiler(TamisBackend(smollm2()[1]))
    try:
        start = time.monotonic()
        compiled = compiler.compile(StructuredOutputsParams(json=schema))
        assert time.monotonic() - start < DEFAULT_TIME_LIMIT_S
    finally:
        compiler.shutdown()
    assert walk(compiled, valid)[0]
    assert not walk(compiled, invalid)[0]
    assert not walk(compiled, valid[:-1])[0]


def test_deep_compile_leaves_the_recursion_limit_as_it_was():
    limit = sys.getrecursionlimit()
    compile_constraint(StructuredOutputsParams(json=nested_objects(DEPTH, True)), smollm2()[1])
    assert sys.getrecursionlimit() == limit


def test_errors_raised_on_the_deep_stack_reach_the_caller():
    schema = nested_arrays(DEPTH)
    inner = schema
    for _ in range(DEPTH - 1):
        inner = inner["items"]
    inner["items"] = {"type": "string", "format": "no-such-format", "minLength": "x"}
    with pytest.raises(SchemaError, match="minLength"):
        compile_constraint(StructuredOutputsParams(json=schema), smollm2()[1])


RECURSIVE_IN_ALL_OF = {
    "$defs": {"node": {"properties": {"v": {"type": "integer"},
                                      "next": {"allOf": [{"$ref": "#/$defs/node"}, {"type": "object"}]}}}},
    "type": "object",
    "properties": {"head": {"$ref": "#/$defs/node"},
                   "tail": {"type": "array", "items": {"anyOf": [{"$ref": "#/$defs/node"}],
                                                       "type": "object"}}},
}


@pytest.mark.parametrize("instance", [
    {"head": {"v": 1, "next": {"v": 2, "next": {}}}},
    {"head": {"next": {"next": {"next": {"v": 3}}}}, "tail": [{"v": 1}, {}]},
    {"head": {"next": 5}},
    {"head": {"next": {"v": "x"}}},
    {"head": {"next": {"next": []}}},
    {"tail": [1]},
    {"tail": [{"next": {"v": 1.5}}]},
    {"head": 7},
])
def test_recursive_ref_inside_all_of_is_merged_once_more(instance):
    """A cycle's $ref beside other constraints in allOf (or beside an anyOf's siblings) is its
    content merged with them once more; the cycle's inner $refs stay rules."""
    import jsonschema
    from conformance import compact
    compiled = compile_constraint(StructuredOutputsParams(json=RECURSIVE_IN_ALL_OF), smollm2()[1])
    valid = jsonschema.Draft202012Validator(RECURSIVE_IN_ALL_OF).is_valid(instance)
    assert walk(compiled, compact(instance))[0] == valid


SELF_MERGING = {"$defs": {"node": {"type": "object", "properties": {
    "v": {"type": "integer"}, "next": {"allOf": [{"$ref": "#/$defs/node"}, {"required": ["v"]}]}}}},
    "$ref": "#/$defs/node"}


@pytest.mark.parametrize("instance", [
    {"next": {"v": 1, "next": {"v": 2}}}, {}, {"next": {}}, {"next": {"v": 1, "next": {}}},
    {"next": {"v": 1, "next": {"v": "2"}}},
])
def test_an_all_of_met_again_inside_its_own_merge_is_a_rule(instance):
    import jsonschema
    from conformance import compact
    compiled = compile_constraint(StructuredOutputsParams(json=SELF_MERGING), smollm2()[1])
    valid = jsonschema.Draft202012Validator(SELF_MERGING).is_valid(instance)
    assert walk(compiled, compact(instance))[0] == valid
