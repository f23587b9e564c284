"""Conditional JSON-schema keywords rewritten into allOf/anyOf (schema -> schema).

``rewrite_conditionals(schema, deref, path)`` returns the schema without ``if``/``then``/
``else``, ``dependentRequired``, ``dependentSchemas`` and ``dependencies``; each becomes one
more ``allOf`` entry holding an ``anyOf`` whose branches are disjoint or whose union is the
keyword's exact meaning:

- ``if``/``then``/``else``: ``anyOf [allOf[if, then], allOf[not-if, else]]``; without
  ``then``: ``anyOf [if, else]`` (exact, since if OR (not-if AND else) = if OR else);
- ``dependentRequired {a: [b, c]}`` (and ``dependencies`` with an array):
  ``anyOf [{properties: {a: false}}, {required: [a, b, c]}]`` ("a absent, or all present");
- ``dependentSchemas {a: S}`` (and ``dependencies`` with a schema):
  ``anyOf [{properties: {a: false}}, allOf[{required: [a]}, S]]``.
Both branches only constrain objects, so other values pass as the keywords say.

``negate(schema)`` builds not-if. Contract: every instance of its result fails ``schema``
(an under-approximation of the negation; exact for what real schemas put in ``if``:
``type``, ``const``/``enum``, ``required``, ``properties`` of those, string and number bounds,
``minItems``/``maxItems``, ``items`` (without prefixItems), ``contains`` (one match wanted),
``patternProperties``, ``propertyNames`` and ``additionalProperties`` without
``patternProperties`` (a member that fails them: ``_some``, see json_witnesses), ``anyOf``, ``not``; ``oneOf`` is negated as ``anyOf``, whose
negation is contained in its own). Any other keyword is *dropped* before negating:
dropping an assertion weakens the schema, so its negation only shrinks (sound; the
else-branch may then refuse some valid instances). ``format`` is dropped too, so the result
holds whether formats are assertions or annotations; ``maxLength`` above 256 is dropped
because json_schema caps it (the capped language is not exact). A negation that would be
too large lets the else-branch accept instances meeting ``if``: that must never happen.
Scalar negations go through the internal keyword ``_negate`` (a list of typed scalar
schemas, compiled by json_schema as "canonical texts of that type minus the schema's
language": printable-ASCII strings without escapes, numbers without exponent, trailing
zeros or ``-0``), where one text per value makes the complement exact.
"""
from __future__ import annotations

from .errors import SchemaError

CONDITIONAL_KEYWORDS = ("if", "then", "else", "dependentRequired", "dependentSchemas", "dependencies")
SCALAR_TYPES = ("null", "boolean", "number", "string")
ALL_TYPES = ("null", "boolean", "number", "string", "array", "object")
STRING_KEYWORDS = ("minLength", "maxLength", "pattern", "_patterns", "format")
NUMBER_KEYWORDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")
MAX_NEGATION_DEPTH = 6
MAX_STRING_NEGATION = 256          # json_schema caps maxLength here: a capped bound is inexact


def has_conditionals(schema) -> bool:
    return isinstance(schema, dict) and any(k in schema for k in CONDITIONAL_KEYWORDS)


def rewrite_conditionals(schema: dict, deref, path: str) -> dict:
    """``schema`` with its conditional keywords moved into ``allOf`` entries (see module doc).
    ``deref(schema, path)`` resolves a top-level ``$ref``/``allOf`` into one dict or bool."""
    out = {k: v for k, v in schema.items() if k not in CONDITIONAL_KEYWORDS}
    extra = []
    if "if" in schema:
        extra += _if_then_else(schema, deref, path)
    required = dict(_dict(schema, "dependentRequired", path))
    schemas = dict(_dict(schema, "dependentSchemas", path))
    for name, value in _dict(schema, "dependencies", path).items():
        (required if isinstance(value, list) else schemas)[name] = value
    for name, others in required.items():
        if not isinstance(others, list) or not all(isinstance(o, str) for o in others):
            raise SchemaError("dependentRequired values must be arrays of strings",
                              f"{path}/dependentRequired/{name}")
        if others:
            extra.append({"anyOf": [{"properties": {name: False}},
                                    {"required": list(dict.fromkeys([name] + others))}]})
    for name, sub in schemas.items():
        if sub is not True and sub != {}:
            extra.append({"anyOf": [{"properties": {name: False}},
                                    {"allOf": [{"required": [name]}, sub]}]})
    if extra:
        out["allOf"] = list(out.get("allOf", [])) + extra
    return out


def _dict(schema: dict, key: str, path: str) -> dict:
    value = schema.get(key, {})
    if not isinstance(value, dict):
        raise SchemaError(f"{key} must be an object", f"{path}/{key}")
    return value


def _if_then_else(schema: dict, deref, path: str) -> list:
    cond, then, other = schema["if"], schema.get("then", True), schema.get("else", True)
    if then is True and other is True:
        return []
    if then is True:
        return [{"anyOf": [cond, other]}]
    try:
        not_cond = negate(cond, deref, f"{path}/if")
    except SchemaError as exc:
        raise SchemaError(f"JSON-schema keyword 'if' is only supported when its negation can "
                          f"be computed: {exc}", f"{path}/if") from None
    return [{"anyOf": [{"allOf": [cond, then]}, {"allOf": [not_cond, other]}]}]


# ---- negation ------------------------------------------------------------------------------
def negate(schema, deref, path: str, depth: int = 0):
    """A schema that only instances failing ``schema`` meet (see module doc). Nested parts
    that cannot be negated (a recursive $ref, nesting deeper than MAX_NEGATION_DEPTH) give
    no failing shape (False), which keeps the contract."""
    if depth > MAX_NEGATION_DEPTH:
        return False
    schema = deref(schema, path)
    if schema is True:
        return False
    if schema is False:
        return True
    if not isinstance(schema, dict):
        raise SchemaError("a schema must be an object or a boolean", path)
    if schema.get("nullable") is True:      # OpenAPI: null is also accepted
        schema = {k: v for k, v in schema.items() if k not in ("type", "enum", "const", "nullable")}
    whole_types: set = set()          # every value of these types fails the schema
    leaves: list = []                 # typed scalar schemas to complement (``_negate``)
    arms: list = []                   # other failing shapes (objects, arrays, nested)
    for key, value in schema.items():
        if key in STRING_KEYWORDS or key in NUMBER_KEYWORDS:
            continue
        where = f"{path}/{key}"
        if key == "type":
            _negate_type(value, whole_types, leaves, where)
        elif key in ("enum", "const"):
            arms += _negate_values([value] if key == "const" else value, whole_types, leaves, where)
        elif key == "required":
            arms += [{"type": "object", "properties": {name: False}} for name in value]
        elif key == "properties":
            for name, sub in value.items():
                negated = _negate_part(sub, deref, f"{where}/{name}", depth)
                if negated is not False:
                    arms.append({"type": "object", "required": [name], "properties": {name: negated}})
        elif key in ("minItems", "maxItems"):
            arms += _negate_count(key, value)
        elif key in ("anyOf", "oneOf"):        # not-oneOf contains not-anyOf (sound)
            parts = [_negate_part(b, deref, f"{where}/{i}", depth) for i, b in enumerate(value)]
            if all(part is not False for part in parts):
                arms.append({"allOf": parts})
        elif key == "not":
            arms.append(value)
        elif key in ("items", "contains"):
            arms += _negate_elements(schema, key, deref, where, depth)
        elif key in ("patternProperties", "propertyNames"):
            arms += _negate_names(key, value, deref, where, depth)
        elif key == "additionalProperties":
            arms += _negate_additional(schema, deref, where, depth)
        # any other keyword is dropped (see module doc: sound)
    leaves += _negate_group(schema, STRING_KEYWORDS, "string", path)
    leaves += _negate_group(schema, NUMBER_KEYWORDS, "number", path)
    out = []
    if whole_types:
        out.append({"type": sorted(whole_types)})
    out += [{"_negate": [leaf]} for leaf in leaves if leaf["type"] not in whole_types]
    out += arms
    if not out:
        return False
    return out[0] if len(out) == 1 else {"anyOf": out}


def _negate_elements(schema: dict, key: str, deref, where: str, depth: int) -> list:
    """Arrays failing ``items`` (one element fails it) or ``contains`` (no element meets it),
    where that is the whole meaning: ``items`` without prefixItems, ``contains`` asking for
    one match at least (minContains 1, no maxContains)."""
    if key == "items" and (not isinstance(schema[key], (dict, bool)) or "prefixItems" in schema):
        return []
    if key == "contains" and (schema.get("minContains", 1) != 1 or "maxContains" in schema):
        return []
    negated = _negate_part(schema[key], deref, where, depth)
    if negated is False:
        return []
    return [{"type": "array", "contains" if key == "items" else "items": negated}]


def _negate_names(key: str, value, deref, where: str, depth: int) -> list:
    """Objects with a member failing ``patternProperties`` (a key matching a pattern, its value
    failing the pattern's schema) or ``propertyNames`` (a key failing it), as the internal
    keyword ``_some`` (json_witnesses)."""
    if key == "propertyNames":
        negated = _negate_part(value, deref, where, depth)
        return [] if negated is False else \
            [{"type": "object", "_some": [{"name": negated, "value": True}]}]
    if not isinstance(value, dict):
        raise SchemaError("patternProperties must be an object", where)
    arms = []
    for pattern, sub in value.items():
        negated = _negate_part(sub, deref, f"{where}/{pattern}", depth)
        if negated is not False:
            arms.append({"type": "object", "_some": [{"name": {"pattern": pattern}, "value": negated}]})
    return arms


def _negate_additional(schema: dict, deref, where: str, depth: int) -> list:
    """Objects with an additional member (a key outside ``properties``) whose value fails
    ``additionalProperties`` (any value, when it is false), as ``_some``; none beside
    ``patternProperties`` (dropped: sound)."""
    props = schema.get("properties", {})
    if schema.get("patternProperties") or not isinstance(props, dict):
        return []
    extra = schema["additionalProperties"]
    negated = True if extra is False else _negate_part(extra, deref, where, depth)
    if negated is False:
        return []
    name = {"not": {"enum": list(props)}} if props else {"type": "string"}
    return [{"type": "object", "_some": [{"name": name, "value": negated}]}]


def _negate_part(schema, deref, path: str, depth: int):
    try:
        return negate(schema, deref, path, depth + 1)
    except SchemaError:
        return False


def _negate_type(value, whole_types: set, leaves: list, where: str) -> None:
    types = {value} if isinstance(value, str) else set(value)
    if not all(isinstance(t, str) for t in types):
        raise SchemaError("type must be a string or an array of strings", where)
    for t in ALL_TYPES:
        if t not in types and not (t == "number" and "integer" in types):
            whole_types.add(t)
    if "integer" in types and "number" not in types:
        leaves.append({"type": "number", "not_integer": True})


def _negate_values(values, whole_types: set, leaves: list, where: str) -> list:
    """Fills ``whole_types`` and ``leaves`` for the scalar values; returns the arms of values
    other than the one object or array of its type (several of one type: no arm, sound)."""
    if not isinstance(values, list):
        raise SchemaError("enum must be an array", where)
    arms = []
    for t in ALL_TYPES:
        mine = [v for v in values if json_type(v) == t]
        if not mine:
            whole_types.add(t)
        elif t in SCALAR_TYPES:
            leaves.append({"type": t, "enum": mine})
        elif len(mine) == 1:
            arms += _other_objects(mine[0]) if t == "object" else _other_arrays(mine[0])
    return arms


def _other_objects(value: dict) -> list:
    """Objects unequal to ``value``: a key missing, another key, or a value unequal."""
    keys = list(value)
    arms = [{"type": "object", "properties": {k: False}} for k in keys]
    arms.append({"type": "object", "_some": [{"name": {"not": {"enum": keys}}, "value": True}]})
    arms += [{"type": "object", "required": [k], "properties": {k: {"not": {"const": value[k]}}}}
             for k in keys]
    return arms


def _other_arrays(value: list) -> list:
    """Arrays unequal to ``value``: another length, or an element unequal."""
    n = len(value)
    arms = [{"type": "array", "minItems": n + 1}] + ([{"type": "array", "maxItems": n - 1}] if n else [])
    arms += [{"type": "array", "minItems": i + 1,
              "prefixItems": [True] * i + [{"not": {"const": item}}]} for i, item in enumerate(value)]
    return arms


def _negate_count(key: str, value) -> list:
    if not isinstance(value, int) or isinstance(value, bool):
        raise SchemaError(f"{key} must be an integer")
    if key == "minItems":
        return [{"type": "array", "maxItems": value - 1}] if value > 0 else []
    return [{"type": "array", "minItems": value + 1}]


def _negate_group(schema: dict, keys: tuple, t: str, path: str) -> list:
    """The typed leaf whose complement holds values of type ``t`` failing ``keys``."""
    group = {k: schema[k] for k in keys if k in schema and k != "format"}
    if t == "string" and isinstance(group.get("maxLength"), int) \
            and group["maxLength"] > MAX_STRING_NEGATION:
        del group["maxLength"]
    return [dict(group, type=t)] if group else []


def json_type(value) -> str:
    """The JSON type of a decoded value; integers and reals are both "number"."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"
