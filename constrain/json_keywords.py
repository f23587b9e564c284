"""The JSON-schema vocabulary the compiler reads: which keywords it handles, which it refuses,
which only annotate, which hold subschemas, the limits it compiles under, and the value and
type comparisons the concerns (``json_objects``, ``json_arrays``, ``json_combinators``...)
share."""
from __future__ import annotations

from .errors import SchemaError
from .json_conditionals import CONDITIONAL_KEYWORDS

MAX_DEPTH = 1000             # subschema nesting (and $ref chain) depth compiled
ALL_TYPES = ("null", "boolean", "number", "string", "array", "object")

ANNOTATIONS = {
    "title", "description", "default", "examples", "example", "$comment", "$schema", "$id", "id",
    "$anchor", "$defs", "definitions", "deprecated", "readOnly", "writeOnly", "$vocabulary",
    "contentMediaType", "contentEncoding", "contentSchema", "discriminator", "xml",
    "externalDocs", "$dynamicAnchor", "$recursiveAnchor",
}
HANDLED = {
    "type", "enum", "const", "properties", "required", "additionalProperties", "items",
    "prefixItems", "additionalItems", "minItems", "maxItems", "minLength", "maxLength", "pattern",
    "format", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "anyOf", "oneOf",
    "allOf", "$ref", "nullable", "multipleOf", "uniqueItems", "minProperties", "maxProperties",
    "_patterns", "not", "propertyNames", "patternProperties", "_negate", "_some", "_contains_all",
    "_anyofs", "_oneofs", "contains", "minContains", "maxContains", *CONDITIONAL_KEYWORDS,
}
UNSUPPORTED = {
    "unevaluatedProperties", "unevaluatedItems", "$dynamicRef", "$recursiveRef",
}
# Keywords whose value is a schema or an array of schemas / an object of schemas (for $id).
SCHEMA_KEYWORDS = {
    "items", "prefixItems", "additionalItems", "additionalProperties", "contains", "propertyNames",
    "if", "then", "else", "not", "allOf", "anyOf", "oneOf", "unevaluatedItems",
    "unevaluatedProperties", "contentSchema",
}
SCHEMA_MAPS = {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas",
               "dependencies"}
TYPE_KEYWORDS = {
    "string": {"minLength", "maxLength", "pattern", "format", "_patterns"},
    "number": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"},
    "array": {"items", "prefixItems", "additionalItems", "minItems", "maxItems", "uniqueItems",
              "contains", "minContains", "maxContains", "_contains_all"},
    "object": {"properties", "required", "additionalProperties", "minProperties", "maxProperties",
               "propertyNames", "patternProperties", "_some"},
}


def nonneg_int(schema: dict, key: str, path: str, default):
    """``schema[key]`` as a non-negative int (``2.0`` taken as 2), ``default`` if absent;
    SchemaError naming the keyword otherwise."""
    value = schema.get(key, default)
    if value is default:
        return value
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise SchemaError(f"{key} must be a non-negative integer", f"{path}/{key}")
    return value


def type_set(types) -> set | None:
    """JSON types a ``type`` keyword admits ("integer" widened to "number"), None if absent."""
    if types is None:
        return None
    names = {types} if isinstance(types, str) else set(types) if isinstance(types, list) else None
    if names is None or not all(isinstance(t, str) for t in names):
        return None
    return {"number" if t == "integer" else t for t in names}


def json_equal(x, y) -> bool:
    """Equality of JSON values as JSON Schema sees them: 1 == 1.0, but true != 1."""
    if isinstance(x, bool) or isinstance(y, bool):
        return type(x) is type(y) and x == y
    if isinstance(x, (int, float)) and isinstance(y, (int, float)):
        return x == y
    if isinstance(x, list) and isinstance(y, list):
        return len(x) == len(y) and all(json_equal(p, q) for p, q in zip(x, y))
    if isinstance(x, dict) and isinstance(y, dict):
        return x.keys() == y.keys() and all(json_equal(x[k], y[k]) for k in x)
    return x == y


def as_json_schema(schema):
    """``schema`` with tamis's internal keywords (``_patterns``: more patterns that must all
    match; ``_negate``: a value of the leaves' type meeting none of them; ``_some``: members
    the object must contain; ``_contains_all``: schemas an element must meet, each;
    ``_anyofs``/``_oneofs``: more anyOf/oneOf lists that must each hold) spelled
    in JSON Schema, for a validator that would otherwise ignore them (and accept too much)."""
    if isinstance(schema, list):
        return [as_json_schema(part) for part in schema]
    if not isinstance(schema, dict):
        return schema
    out, more = {}, []
    for key, value in schema.items():
        if key == "_patterns":
            more += [{"pattern": pattern} for pattern in value]
        elif key == "_negate":
            more.append(_negation_as_json_schema(value))
        elif key == "_some":
            more += [_member_as_json_schema(req) for req in value]
        elif key == "_contains_all":
            more += [{"contains": as_json_schema(sub)} for sub in value]
        elif key in ("_anyofs", "_oneofs"):
            more += [{key[1:-1].replace("of", "Of"): as_json_schema(b)} for b in value]
        elif key in ("enum", "const", "default", "examples", "required"):
            out[key] = value                      # values, not schemas
        elif key in SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: as_json_schema(sub) for name, sub in value.items()}
        else:
            out[key] = as_json_schema(value)
    if more:
        out["allOf"] = list(out.get("allOf", [])) + more
    return out


def _member_as_json_schema(req: dict) -> dict | bool:
    """A ``_some`` requirement (json_witnesses) in JSON Schema where it can be said: a name
    failing ``not name`` or a pattern's key with a value failing ``not value``; otherwise
    False (no value: a validator then filters every enum value out, which is sound)."""
    if req["value"] is True:
        return {"not": {"propertyNames": {"not": as_json_schema(req["name"])}}}
    if isinstance(req["name"], dict) and req["name"].keys() == {"pattern"}:
        return {"not": {"patternProperties": {req["name"]["pattern"]: {"not": as_json_schema(req["value"])}}}}
    return False


def _negation_as_json_schema(leaves: list) -> dict | bool:
    types = {leaf["type"] for leaf in leaves}
    if len(types) != 1:
        return False
    # a "not_integer" leaf stands for the integers (its complement: the other numbers)
    met = [{"type": "integer"} if leaf.get("not_integer") else as_json_schema(leaf)
           for leaf in leaves]
    return {"type": types.pop(), "not": {"anyOf": met}}
