"""``anyOf``, ``oneOf`` and ``not``.

- **anyOf**: an alternation of the branches, each merged with the keywords beside it;
- **oneOf**: branches proved disjoint on their schemas (types, const/enum values, a property
  both require with disjoint values, a required name the other forbids) are an alternation;
  an overlapping branch with finitely many values keeps those no overlapping branch accepts
  (checked by the validator); any other branch is intersected with the negation of each
  branch it may overlap (``json_conditionals.negate``: sound, may refuse valid values);
- **not**: the exact difference of two languages where the negated schema's language holds
  every text of its values (``_every_text``); otherwise the schema intersected with the
  negation, written as canonical texts of one type (``CANONICAL``) minus the negated ones."""
from __future__ import annotations

import json
import math
from decimal import Decimal

from . import deadline
from . import regex_ast as ra
from .errors import SchemaError
from .json_conditionals import CONDITIONAL_KEYWORDS, json_type, negate
from .json_keywords import ANNOTATIONS, json_equal, type_set
from .json_strings import MAX_STRING_LENGTH, QUOTE, SAFE_CHAR
from .regex_parser import parse_regex


# Canonical texts (one per value) for negations: strings without escapes (printable ASCII
# only when a pattern is negated, so that ECMAScript's and tamis's \s, \w, \d agree on
# them), numbers without exponent, trailing fraction zeros or "-0".
CANONICAL_ASCII_STRING = parse_regex(r'"[ !#-\[\]-~]*"')
CANONICAL = {
    "string": ra.seq(QUOTE, ra.rep(SAFE_CHAR, 0, None), QUOTE),
    "number": parse_regex(r"0|-?[1-9][0-9]*(\.[0-9]*[1-9])?|-?0\.[0-9]*[1-9]"),
    "boolean": ra.alt(ra.literal("true"), ra.literal("false")),
    "null": ra.literal("null"),
}
CANONICAL_INTEGER = parse_regex(r"0|-?[1-9][0-9]*")


class Combinators:
    """anyOf/oneOf/not for ``_SchemaCompiler``, a mixin: the host provides ``value(schema,
    path, depth)``, ``_enum(schema, path)``, ``_literal(value)``, ``_valid(value, schema,
    formats)``, ``json_merge``'s ``_merge``, ``_deref`` and ``_peek``, and ``json_refs``'s
    ``_ids`` and ``_ids_root``."""

    def _not(self, schema: dict, path: str, depth: int) -> tuple:
        """Regular schema and a negated schema whose language holds *every* text of its values
        (``_every_text``): the exact difference of the languages. A difference with any other
        language would let through other texts of excluded values ("\\u0061" for "a", 1.50
        for 1.5, objects in another key order). Otherwise (recursive, free-form, or a negated
        schema tamis cannot compile): the schema intersected with json_conditionals.negate
        (sound, may refuse valid values)."""
        rest = {k: v for k, v in schema.items() if k != "not"}
        if "enum" in rest or "const" in rest:
            return self._enum(schema, path)    # each value checked against the whole schema
        try:
            excluded = self.value(schema["not"], f"{path}/not", depth + 1)
        except SchemaError:
            excluded = None
        if excluded == ra.NOTHING:
            return self.value(rest, path, depth + 1)
        if excluded is not None and not ra.has_rules(excluded) and _every_text(schema["not"]):
            base = self.value(rest, path, depth + 1)
            if not ra.has_rules(base):
                return ("diff", base, excluded)
        negated = negate(schema["not"], self._peek, f"{path}/not")
        if negated is False:
            return ra.NOTHING              # no value provably fails the negated schema
        return self.value({"allOf": [rest, negated]}, path, depth + 1)

    def _negated(self, schema: dict, path: str, depth: int) -> tuple:
        """``_negate`` (from json_conditionals.negate): canonical texts of the leaves' type
        that are in none of the leaves, intersected with the rest of the schema."""
        leaves = schema["_negate"]
        types = {leaf["type"] for leaf in leaves}
        if len(types) > 1:
            return ra.NOTHING
        t = types.pop()
        node = CANONICAL[t]
        for leaf in leaves:
            if "pattern" in leaf or "_patterns" in leaf:
                node = ("and", node, CANONICAL_ASCII_STRING)
            node = ("diff", node, self._leaf_language(leaf, path, depth))
        rest = {k: v for k, v in schema.items() if k != "_negate"}
        if any(k not in ANNOTATIONS for k in rest):
            typed = self._merge(dict(rest), {"type": t}, path)
            base = ra.NOTHING if typed is False else self.value(typed, path, depth + 1)
            if ra.has_rules(base):
                raise SchemaError("a negated condition inside a recursive value", path)
            node = ("and", base, node)
        return node

    def _leaf_language(self, leaf: dict, path: str, depth: int) -> tuple:
        """The canonical texts meeting ``leaf`` (exact on canonical texts)."""
        if leaf.get("not_integer"):
            return CANONICAL_INTEGER
        if "enum" in leaf:
            return ra.alt(*(_canonical_literal(v) for v in leaf["enum"]))
        return self.value(leaf, path, depth + 1)

    def _alternatives(self, schema: dict, path: str, depth: int) -> tuple:
        # with both, anyOf goes first: its branches are merged with a base that keeps oneOf
        keyword = "anyOf" if "anyOf" in schema else "oneOf"
        branches = schema[keyword]
        if not isinstance(branches, list) or not branches:
            raise SchemaError(f"{keyword} must be a non-empty array", f"{path}/{keyword}")
        base = {k: v for k, v in schema.items() if k != keyword}
        has_base = any(k not in ANNOTATIONS for k in base)
        nodes, schemas = [], []
        for i, branch in enumerate(branches):
            where = f"{path}/{keyword}/{i}"
            if has_base:
                branch = self._deref(branch, where, depth)
                if branch is False:
                    continue
                merged = self._merge(dict(base), branch if isinstance(branch, dict) else {}, where)
                if merged is not False:
                    nodes.append(self.value(merged, where, depth + 1))
                    schemas.append(merged)
            else:
                nodes.append(self.value(branch, where, depth + 1))
                try:                        # content, not a $ref (may be one being compiled)
                    schemas.append(self._peek(branch, where))
                except SchemaError:
                    schemas.append(branch)
        if keyword == "oneOf":
            return self._one_of(nodes, schemas, path, depth)
        return ra.alt(*nodes)

    def _one_of(self, nodes: list, schemas: list, path: str, depth: int) -> tuple:
        """Exactly one branch. Branches proved disjoint on their schemas (``_disjoint``) are a
        plain alternation; a branch that may overlap others becomes allOf[branch, negate(each
        overlapping other)] (json_conditionals.negate: sound, may refuse valid instances).
        Disjoint *texts* prove nothing: with properties in schema order, {"a":1,"b":2} is
        written differently by branches requiring a and b, yet meets both."""
        live = [(n, sch) for n, sch in zip(nodes, schemas) if n != ra.NOTHING]
        overlaps = {i: [] for i in range(len(live))}
        for i in range(len(live)):
            for j in range(i + 1, len(live)):
                if not self._disjoint(live[i][1], live[j][1], path):
                    overlaps[i].append(j)
                    overlaps[j].append(i)
        out = []
        for i, (node, schema) in enumerate(live):
            if not overlaps[i]:
                out.append(node)
                continue
            where = f"{path}/oneOf/{i}"
            only_here = self._values_in_one_branch(schema, [live[j][1] for j in overlaps[i]], where)
            if only_here is not None:
                out.append(ra.alt(*(self._literal(v) for v in only_here)))
                continue
            try:
                others = [negate(live[j][1], self._peek, where) for j in overlaps[i]]
            except SchemaError:
                continue                    # cannot negate: the branch is left out (sound)
            if any(o is False for o in others):
                continue                    # no instance provably fails some other branch
            out.append(self.value({"allOf": [schema] + others}, where, depth + 1))
        return ra.alt(*out)

    def _values_in_one_branch(self, schema, others: list, path: str) -> list | None:
        """A branch with finitely many values (const/enum, or anyOf/oneOf of such): those it
        accepts that no overlapping branch does, each checked by the validator (exact where
        negating the others would drop arrays and objects); None for other branches."""
        if not isinstance(schema, dict):
            return None
        values = self._values_of(schema, path)
        text = json.dumps([schema] + others, default=str)
        if values is None or "nullable" in text:
            return None                 # OpenAPI's nullable: null passes where the validator says no
        if '"$ref"' in text and any(uri != self._ids_root() for uri in self._ids):
            return None                 # the validator resolves $refs from the root's base only
        try:                            # formats asserted here, annotations there: the stricter
            return [v for v in values if self._valid(v, schema, formats=True)
                    and not any(self._valid(v, other) for other in others)]
        except SchemaError:
            return None

    def _disjoint(self, a, b, path: str, depth: int = 0) -> bool:
        """True only if no instance can meet both schemas (False = unknown). Checks types,
        const/enum values, and recursively the values of properties both require."""
        deadline.check()
        try:
            a, b = self._peek(a, path), self._peek(b, path)
        except SchemaError:
            return False
        if not isinstance(a, dict) or not isinstance(b, dict) or depth > 4:
            return a is False or b is False
        va, vb = self._values_of(a, path), self._values_of(b, path)
        if va is not None and vb is not None and not any(json_equal(x, y) for x in va for y in vb):
            return True
        for x, y in ((a, b), (b, a)):
            # x's instances all meet one of its anyOf/oneOf branches: disjoint from y if each is
            for keyword in ("anyOf", "oneOf"):
                branches = x.get(keyword)
                if isinstance(branches, list) and branches and \
                        all(self._disjoint(branch, y, path, depth + 1) for branch in branches):
                    return True
        if any(k in x for x in (a, b) for k in ("anyOf", "oneOf", "not", "nullable",
                                                 *CONDITIONAL_KEYWORDS)):
            return False
        ta, tb = type_set(a.get("type")), type_set(b.get("type"))
        if ta is not None and tb is not None and not ta & tb:
            return True
        for values, other in ((va, tb), (vb, ta)):
            if values is not None and other is not None and not {json_type(v) for v in values} & other:
                return True
        if ta != {"object"} and tb != {"object"}:
            return False            # non-objects meet "required"/"properties" vacuously
        props_a, props_b = a.get("properties", {}), b.get("properties", {})
        for x, y, props_x in ((a, b, props_a), (b, a, props_b)):
            # y requires a name that x forbids (not declared, no patterns, no extras)
            if x.get("additionalProperties") is False and not x.get("patternProperties") \
                    and isinstance(y.get("required"), list) \
                    and any(isinstance(n, str) and n not in props_x for n in y["required"]):
                return True
        both = set(a.get("required", [])) & set(b.get("required", []))
        return any(name in props_a and name in props_b
                   and self._disjoint(props_a[name], props_b[name], path, depth + 1)
                   for name in both if isinstance(name, str))

    def _values_of(self, schema, path: str, depth: int = 0):
        """A finite superset of the values ``schema`` allows (const/enum, or anyOf/oneOf of
        such), or None if there is none."""
        if "const" in schema:
            return [schema["const"]]
        if isinstance(schema.get("enum"), list):
            return schema["enum"]
        if schema.get("nullable") is True or depth > 8:
            return None
        for keyword in ("anyOf", "oneOf"):
            branches = schema.get(keyword)
            if isinstance(branches, list) and branches:
                out = []
                for branch in branches:
                    try:
                        branch = self._peek(branch, path)
                    except SchemaError:
                        return None
                    values = [] if branch is False else \
                        self._values_of(branch, path, depth + 1) if isinstance(branch, dict) else None
                    if values is None:
                        return None
                    out += values
                return out
        return None


def _every_text(schema) -> bool:
    """True if tamis's language for ``schema`` contains every JSON text of each value it
    accepts (so a difference with it is exact): plain null/boolean/number/string types with
    at most string length bounds (uncapped)."""
    if not isinstance(schema, dict):
        return False
    keys = {k for k in schema if k not in ANNOTATIONS}
    types = type_set(schema.get("type"))
    if "type" not in keys or types is None or "integer" in _as_list(schema["type"]) \
            or not types <= {"null", "boolean", "number", "string"}:
        return False
    if not keys <= {"type", "minLength", "maxLength"}:
        return False
    return not isinstance(schema.get("maxLength"), (int, float)) or schema["maxLength"] <= MAX_STRING_LENGTH


def _as_list(value) -> list:
    return value if isinstance(value, list) else [value]


def _canonical_literal(value) -> tuple:
    """The canonical text of a scalar (see CANONICAL)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if isinstance(value, float) and not math.isfinite(value):
            return ra.NOTHING
        text = format(Decimal(repr(value) if isinstance(value, float) else value).normalize(), "f")
        return ra.literal("0" if text in ("-0", "0") else text)
    return ra.literal(json.dumps(value, ensure_ascii=False))
