"""Equal subschemas are compiled once (``json_content.ContentIds`` keys the compiler's
cache): equal content only, key order included, and never across base URIs."""
from conformance import smollm2, walk
from tamis.constrain import StructuredOutputsParams, compile_constraint
from tamis.constrain import json_schema
from tamis.constrain.json_content import ContentIds


def _ok(schema, text) -> bool:
    return walk(compile_constraint(StructuredOutputsParams(json=schema), smollm2()[1]), text)[0]


def test_content_ids_equal_content_only():
    ids = ContentIds()
    shared = {"enum": [1, 2]}
    assert ids.of({"a": shared, "b": [shared]}) == ids.of({"a": {"enum": [1, 2]}, "b": [{"enum": [1, 2]}]})
    assert ids.of({"a": 1, "b": 2}) != ids.of({"b": 2, "a": 1})      # properties order counts
    assert len({ids.of(1), ids.of(True), ids.of(1.0), ids.of("1")}) == 4
    assert ids.of([1, [2]]) != ids.of([1, 2]) and ids.of([]) != ids.of({})


def test_an_equal_subschema_is_compiled_once(monkeypatch):
    branch = {"oneOf": [{"type": "integer"}, {"type": "object", "properties": {"n": {"type": "string"}}}]}
    schema = {"type": "object", "properties": {f"p{i}": {**branch, "description": f"#{i}"}
                                               for i in range(6)},
              "definitions": {}}
    calls = []
    original = json_schema._SchemaCompiler._value_of

    def counting(self, sub, path, depth):
        if "oneOf" in sub:
            calls.append(path)
        return original(self, sub, path, depth)

    monkeypatch.setattr(json_schema._SchemaCompiler, "_value_of", counting)
    json_schema.compile_json_schema({**schema, "properties": {k: dict(branch) for k in schema["properties"]}})
    assert len(calls) == 1          # six equal fresh copies: one compile
    calls.clear()
    json_schema.compile_json_schema(schema)                  # descriptions differ: six compiles
    assert len(calls) == 6


def test_equal_but_for_property_order_keeps_each_order():
    def pair(first, second):
        return {"anyOf": [{"type": "null"},
                          {"type": "object", "additionalProperties": False, "required": [first, second],
                           "properties": {first: {"type": "integer"}, second: {"type": "integer"}}}]}
    schema = {"type": "object", "required": ["a", "b"], "additionalProperties": False,
              "properties": {"a": pair("x", "y"), "b": pair("y", "x")}}
    assert _ok(schema, '{"a":{"x":1,"y":2},"b":{"y":2,"x":1}}')
    assert not _ok(schema, '{"a":{"x":1,"y":2},"b":{"x":1,"y":2}}')


def test_equal_content_under_two_base_uris_resolves_apart():
    # the same anyOf, [{"$ref": "#/definitions/v"}, null], names a different schema in each
    # embedded document: no cache may join them
    def embedded(uri, value_schema):
        return {"$id": uri, "definitions": {"v": value_schema}, "type": "object",
                "required": ["v"], "additionalProperties": False,
                "properties": {"v": {"anyOf": [{"$ref": "#/definitions/v"}, {"type": "null"}]}}}
    schema = {"$id": "https://example.com/root.json", "type": "object", "additionalProperties": False,
              "required": ["s", "i"],
              "properties": {"s": embedded("https://example.com/s.json", {"type": "string"}),
                             "i": embedded("https://example.com/i.json", {"type": "integer"})}}
    assert _ok(schema, '{"s":{"v":"x"},"i":{"v":3}}')
    assert not _ok(schema, '{"s":{"v":3},"i":{"v":3}}')
    assert not _ok(schema, '{"s":{"v":"x"},"i":{"v":"x"}}')
