"""``allOf``: schemas merged keyword by keyword into one (``properties`` joined, bounds
tightened, ``type`` and ``enum`` intersected, ``multipleOf`` steps combined into their least
common multiple, a second ``pattern`` kept beside the first, a second ``anyOf``/``oneOf`` list
kept pending, ``propertyNames`` joined by allOf), and the ``$ref``s at the top of
a subschema followed so that its content can be merged or analysed.

Two values of a keyword that cannot be combined raise ``SchemaError`` naming the keyword; a
merge that no value can meet (disjoint types, enums, consts) is ``False``."""
from __future__ import annotations

import json
import math
from fractions import Fraction

from . import deadline
from .errors import SchemaError
from .json_conditionals import has_conditionals, rewrite_conditionals
from .json_keywords import ANNOTATIONS, HANDLED, MAX_DEPTH, UNSUPPORTED, json_equal


class SchemaMerging:
    """``allOf`` for ``_SchemaCompiler``, a mixin: the host provides ``_resolve(ref, schema,
    path)``, ``_active`` and ``_unrollings`` (``json_refs``)."""

    def _rewrite(self, schema: dict, path: str) -> dict:
        """Conditional keywords -> allOf/anyOf (json_conditionals); other schemas unchanged."""
        if not has_conditionals(schema):
            return schema
        return rewrite_conditionals(schema, self._peek, path)

    def _merge_all_of(self, schema: dict, path: str, depth: int) -> dict:
        merged = {k: v for k, v in schema.items() if k != "allOf"}
        parts = schema["allOf"]
        if not isinstance(parts, list) or not parts:
            raise SchemaError("allOf must be a non-empty array", f"{path}/allOf")
        for i, part in enumerate(parts):
            part = self._deref(part, f"{path}/allOf/{i}", depth)
            if part is False:
                return False
            if part is True:
                continue
            merged = self._merge(merged, part, f"{path}/allOf/{i}")
            if merged is False:
                return False
        return merged

    def _deref(self, schema, path: str, depth: int):
        """The schema with a top-level $ref (and nested allOf) replaced by its content."""
        for _ in range(MAX_DEPTH):
            if isinstance(schema, dict) and "$ref" in schema:
                target, key = self._resolve(schema["$ref"], schema, path)
                if key in self._active:
                    self._count_unrolling(key, path)
                rest = {k: v for k, v in schema.items() if k != "$ref"}
                if target is False:
                    return False
                schema = self._merge(dict(target) if isinstance(target, dict) else {}, rest, path)
                if schema is False:
                    return False
                continue
            if isinstance(schema, dict) and "allOf" in schema:
                schema = self._merge_all_of(schema, path, depth + 1)
                continue
            return schema
        raise SchemaError("$ref chain too long", path)

    def _all_of_key(self, schema: dict, path: str) -> str | None:
        """For an allOf holding a $ref: a name for the merged schema (its references resolved,
        its base URI and its JSON), so that meeting the same allOf again inside the content
        it merges in (a cycle through allOf) is a rule (``json_refs._named``); else None."""
        parts = schema.get("allOf")
        keys = [self._resolve(part["$ref"], part, path)[1]
                for part in (parts if isinstance(parts, list) else ())
                if isinstance(part, dict) and isinstance(part.get("$ref"), str)]
        if not keys:
            return None
        base = self._base_of.get(id(schema), "")
        return f"allOf[{' & '.join(keys)}] in {base}: {json.dumps(schema, sort_keys=True, default=str)}"

    def _count_unrolling(self, key: str, path: str) -> None:
        """A $ref being compiled (a cycle) met inside allOf is merged in once more: its
        content, with the cycle's inner $refs compiled as rules. ``MAX_UNROLLINGS`` per
        reference bound the work where the allOf sits inside the cycle itself."""
        count = self._unrollings.get(key, 0) + 1
        if count > MAX_UNROLLINGS:
            raise SchemaError(f"recursive $ref inside allOf met more than {MAX_UNROLLINGS} "
                              "times (it repeats inside its own cycle)", path)
        self._unrollings[key] = count

    def _peek(self, schema, path: str):
        """Like ``_deref`` for analysis (disjointness, negation): a $ref to a schema being
        compiled is followed too (the result is read, never compiled in place)."""
        for _ in range(MAX_DEPTH):
            if isinstance(schema, dict) and "$ref" in schema:
                target, _ = self._resolve(schema["$ref"], schema, path)
                rest = {k: v for k, v in schema.items() if k != "$ref" and k not in ANNOTATIONS}
                if not rest:
                    schema = target
                    continue
                if target is False:
                    return False
                schema = self._merge(dict(target) if isinstance(target, dict) else {}, rest, path)
                continue
            if isinstance(schema, dict) and "allOf" in schema:
                return self._deref(schema, path, 0)
            return schema
        raise SchemaError("$ref chain too long", path)

    def _merge(self, a: dict, b: dict, path: str):
        deadline.check()
        a, b = self._rewrite(a, path), self._rewrite(b, path)
        a, b = _items_at_every_position(a, b, path), _items_at_every_position(b, a, path)
        a, b = _contains_as_list(a, b), _contains_as_list(b, a)
        out = dict(a)
        for key, value in b.items():
            if key in ANNOTATIONS or key not in out:
                out.setdefault(key, value)
                continue
            merged = _merge_keyword(key, out[key], value, out, path)
            if merged is _UNSAT:
                return False
            out[key] = merged
        _apply_additional(out, a, b)
        _apply_additional(out, b, a)
        return out


_UNSAT = object()
MAX_UNROLLINGS = 8


def _items_at_every_position(side: dict, other: dict, path: str) -> dict:
    """``side`` with at least as many ``prefixItems`` as ``other``: the positions it adds are
    its ``items`` (true without), which governs every position past its own prefix, so that
    both merge position by position."""
    prefix = other.get("prefixItems")
    if prefix is None or "items" not in side and "prefixItems" not in side:
        return side
    own = side.get("prefixItems", [])
    items = side.get("items", True)
    if not isinstance(prefix, list) or not isinstance(own, list) or not isinstance(items, (dict, bool)):
        raise SchemaError("cannot combine 'prefixItems' and 'items' from different allOf "
                          "branches (their meaning depends on the branch)", path)
    if len(own) >= len(prefix):
        return side
    return dict(side, prefixItems=list(own) + [items] * (len(prefix) - len(own)))


def _contains_as_list(side: dict, other: dict) -> dict:
    """Two different ``contains`` (each wanting one match) become ``_contains_all``, a list
    that merges by concatenation (json_contains: an element meeting each)."""
    counted = ("minContains", "maxContains")
    if "contains" not in side or "contains" not in other and "_contains_all" not in other \
            or any(k in s for s in (side, other) for k in counted) \
            or json_equal(side["contains"], other.get("contains")):
        return side
    out = {k: v for k, v in side.items() if k != "contains"}
    out["_contains_all"] = list(side.get("_contains_all", [])) + [side["contains"]]
    return out


def _common_multiple(x, y):
    """The least common multiple of two positive steps, exact for decimals (2 and 3 -> 6,
    0.5 and 0.3 -> 1.5): a number is a multiple of both iff it is a multiple of it."""
    fx, fy = Fraction(str(x)), Fraction(str(y))
    step = Fraction(math.lcm(fx.numerator, fy.numerator), math.gcd(fx.denominator, fy.denominator))
    return int(step) if step.denominator == 1 else float(step)


def _merge_keyword(key, x, y, merged, path):
    """The value of ``key`` meeting both ``x`` and ``y`` (``merged``, the schema being built,
    may take a second pattern), ``_UNSAT`` if none can."""
    if key == "properties":
        out = dict(x)
        for name, sub in y.items():
            out[name] = _both(out[name], sub) if name in out else sub
        return out
    if key == "required":
        return list(dict.fromkeys(list(x) + list(y)))
    if key in ("minimum", "minLength", "minItems", "minProperties"):
        return max(x, y)
    if key in ("maximum", "maxLength", "maxItems", "maxProperties"):
        return min(x, y)
    if key == "exclusiveMinimum" and not isinstance(x, bool):
        return max(x, y)
    if key == "exclusiveMaximum" and not isinstance(x, bool):
        return min(x, y)
    if key == "type":
        xs = {x} if isinstance(x, str) else set(x)
        ys = {y} if isinstance(y, str) else set(y)
        both = (xs & ys) | ({"integer"} if ("integer" in xs and "number" in ys)
                            or ("number" in xs and "integer" in ys) else set())
        return sorted(both) if both else _UNSAT
    if key == "multipleOf" and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                   and v > 0 for v in (x, y)):
        return _common_multiple(x, y)
    if key == "enum":
        kept = [v for v in x if any(json_equal(v, w) for w in y)]
        return kept if kept else _UNSAT
    if key == "const":
        return x if json_equal(x, y) else _UNSAT
    if key == "pattern":
        if x == y:
            return x
        return _merge_patterns(merged, x, y)
    if key == "prefixItems" and isinstance(x, list) and isinstance(y, list) and len(x) == len(y):
        return [_both(p, q) for p, q in zip(x, y)]
    if key in ("items", "additionalProperties", "additionalItems"):
        if isinstance(x, dict) and isinstance(y, dict) or isinstance(x, bool) or isinstance(y, bool):
            if x is True:
                return y
            if y is True:
                return x
            if x is False or y is False:
                return False
            return _both(x, y)
    if key in ("anyOf", "oneOf") and not json_equal(x, y):
        # both must hold: the second list waits in ``_anyofs``/``_oneofs`` until the first is
        # compiled (json_schema), each of its branches merged with the rest: pairs are met
        # only where they merge (a cross product here doubles with every conditional of an
        # allOf, and two oneOf lists have no cross product)
        pending = f"_{key.lower()}s"
        merged[pending] = merged.get(pending, []) + [y]
        return x
    if key == "allOf":
        return list(x) + list(y)
    if key == "not":
        return {"anyOf": [x, y]}
    if key == "propertyNames":
        return _both(x, y)
    if key in ("_negate", "_patterns", "_some", "_contains_all", "_anyofs", "_oneofs"):
        return list(x) + list(y)
    if key == "patternProperties":
        out = dict(x)
        for pattern, sub in y.items():
            out[pattern] = _both(out[pattern], sub) if pattern in out else sub
        return out
    if key not in HANDLED and key not in UNSUPPORTED:
        return x                           # an annotation or unknown keyword: no effect
    if json.dumps(x, sort_keys=True) == json.dumps(y, sort_keys=True):
        return x
    raise SchemaError(f"cannot combine two different values of {key!r} in allOf", path)


def _both(x, y):
    """Both subschemas must hold: one of them when they are the same (a recursive $ref met
    twice stays a $ref, which an allOf could not follow)."""
    return x if json_equal(x, y) else {"allOf": [x, y]}


def _merge_patterns(out, x, y):
    # Two patterns must both hold: keep one and record the other for the string compiler
    # (in the merged schema: a copy of the first side).
    out["_patterns"] = out.get("_patterns", []) + [y]
    return x


def _apply_additional(out: dict, side: dict, other: dict) -> None:
    """allOf: a side's additionalProperties also governs the other side's extra property names
    (those of its properties, required names and patternProperties that ``side`` declares
    neither as a property nor as a pattern)."""
    extra = side.get("additionalProperties", True)
    if extra is True:
        return
    foreign = set(other.get("patternProperties", {})) - set(side.get("patternProperties", {}))
    if foreign and extra is False:
        # every key is one of side's properties or matches one of its patterns: said exactly
        # as propertyNames (out's own additionalProperties, false, then adds nothing)
        allowed = [{"pattern": p} for p in side.get("patternProperties", {})]
        if side.get("properties"):
            allowed.append({"enum": list(side["properties"])})
        names = {"anyOf": allowed} if allowed else False
        out["propertyNames"] = _both(out["propertyNames"], names) if "propertyNames" in out else names
        return
    if foreign:
        _govern_patterns(out, side, foreign, extra)
    own = set(side.get("properties", {}))
    patterns = list(side.get("patternProperties", {}))
    props = dict(out.get("properties", {}))
    for name in other.get("properties", {}):
        if name not in own and not _matches_any(patterns, name):
            props[name] = {"allOf": [props[name], extra]} if name in props else extra
    for name in other.get("required", []):
        if name not in own and name not in props and not _matches_any(patterns, name):
            props[name] = extra
    if props:
        out["properties"] = props


def _matches_any(patterns: list, name) -> bool:
    """Whether one of ``side``'s patternProperties surely matches ``name`` (then the name is
    not additional for that side: its pattern's schema, kept in the merge, governs it). A
    pattern Python cannot read counts as no match: the name then takes the side's
    additionalProperties, as before (sound, may refuse a valid name)."""
    if not isinstance(name, str):
        return False
    import re
    for pattern in patterns:
        try:
            if re.search(pattern, name, re.ASCII) is not None:
                return True
        except re.error:
            continue
    return False


def _govern_patterns(out: dict, side: dict, patterns: set, extra) -> None:
    """The other side's ``patterns`` also take ``side``'s additionalProperties: exact when
    ``side`` has no patternProperties of its own and none of its property names matches one
    of them (the keys they match are then all additional for ``side``); otherwise refused."""
    import re
    names = list(side.get("properties", {}))
    try:
        overlap = side.get("patternProperties") or any(
            re.search(p, n) for p in patterns for n in names)
    except re.error:
        overlap = True
    if overlap:
        raise SchemaError("allOf: additionalProperties in one branch and patternProperties in "
                          "another cannot be combined")
    props = dict(out.get("patternProperties", {}))
    for pattern in patterns:
        props[pattern] = _both(props[pattern], extra)
    out["patternProperties"] = props
