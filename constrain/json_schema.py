"""JSON schema -> regex AST (plus grammar rules where the schema is recursive).

``compile_json_schema(schema, ...) -> (root_node, rules)``. ``rules`` maps names to AST nodes
that may reference each other through ("rule", name) nodes; it is empty when the schema is
regular, and then ``root_node`` is a plain regex compiled to one DFA. Rules appear for
``$ref`` cycles and for values of any shape (``{}``, ``true``, additional properties
without a schema), whose nesting is unbounded.

Policies (each tested in tests/constrain/test_json_policies.py):
- **property order**: declared properties appear in schema order; optional ones may be
  skipped; additional properties (when allowed) come after the declared ones;
- **additionalProperties** absent = allowed (the JSON-schema default), unless the request
  sets ``disable_additional_properties``;
- **whitespace**: between tokens at most one newline followed by up to 20 spaces/tabs
  (``DEFAULT_WHITESPACE``); none with ``disable_any_whitespace``; ``whitespace_pattern``
  replaces it; never before the value or after it;
- **numbers**: see ``json_numbers``; **strings** constrained by ``pattern`` or ``format``
  are written without escape sequences; **formats**: see ``json_formats``;
- **oneOf**: branches proved disjoint on their schemas (types, const/enum, a property both
  require with disjoint values, a required name the other forbids) are an alternation; any
  other branch is intersected with the negation of the branches it may overlap (sound);
- **conditionals** (``if``/``then``/``else``, ``dependentRequired``, ``dependentSchemas``,
  ``dependencies``) and ``not`` around recursive or free-form schemas: rewritten into
  allOf/anyOf by ``json_conditionals`` (negation exact for type/const/enum/required/
  properties/bounds, otherwise an under-approximation: sound, may refuse valid values);
- **long bounds**: ``maxLength`` above 256 and ``maxItems`` above 128 are enforced as 256 / 128
  (sound: outputs still satisfy the schema; longer valid values are refused).

Keywords that constrain values but cannot be enforced (``uniqueItems: true`` beyond arrays of
one item or items of at most ``MAX_UNIQUE_VALUES`` enumerated values, ``contains``,
``unevaluated*``, ``$dynamicRef``, remote ``$ref``, formats of the specification tamis has no
regex for...) raise ``SchemaError`` naming the keyword and its JSON pointer. Keywords that only
annotate (``title``, ``description``, ``default``, ``examples``, unknown keywords, formats
outside the specification) are ignored.
"""
from __future__ import annotations

import itertools
import json
import math
from fractions import Fraction
from urllib.parse import urldefrag, urljoin

from . import deadline
from . import regex_ast as ra
from .errors import ConstraintError, SchemaError
from .json_conditionals import (CONDITIONAL_KEYWORDS, has_conditionals, json_type, negate,
                                rewrite_conditionals)
from .json_formats import FORMAT_MAX_LENGTH, format_node, is_annotation_only
from .json_numbers import ANY_NUMBER, int_range, number_range
from .regex_parser import parse_regex

DEFAULT_WHITESPACE = r"(\r?\n)?[ \t]{0,20}"
# String content characters that need no escape: everything but '"', '\' and controls.
SAFE_CHARS = ra.normalize_ranges(((0x20, 0x21), (0x23, 0x5B), (0x5D, 0x10FFFF)))
SAFE_CHAR = ("chars", SAFE_CHARS)
ESCAPE = parse_regex(r'\\(["\\/bfnrt]|u[0-9a-fA-F]{4})')
STRING_UNIT = ra.alt(SAFE_CHAR, ESCAPE)
QUOTE = ra.char('"')
ANY_STRING = ra.seq(QUOTE, ra.rep(STRING_UNIT, 0, None), QUOTE)
SCALARS = ra.alt(ra.literal("null"), ra.literal("true"), ra.literal("false"), ANY_NUMBER, ANY_STRING)
MAX_DEPTH = 60
# Policy: upper bounds above these are enforced as these (sound: every output still meets
# the schema's bound; only longer valid values are out of reach). Unrolling maxLength 4096
# would cost thousands of automaton states per field.
MAX_STRING_LENGTH = 256
MAX_ARRAY_ITEMS = 128
MAX_ENUM = 100_000           # an enum compiles in linear time; the compile time limit still holds
MAX_UNIQUE_VALUES = 6        # uniqueItems over a finite item domain: every ordering (1,957 at 6)
MAX_MEMBER_CHOICES = 64      # maxProperties below the declared count: alternatives enumerated
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
    "_patterns", "not", "propertyNames", "patternProperties", "_negate", *CONDITIONAL_KEYWORDS,
}
UNSUPPORTED = {
    "unevaluatedProperties", "unevaluatedItems", "contains", "minContains", "maxContains",
    "$dynamicRef", "$recursiveRef",
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
    "array": {"items", "prefixItems", "additionalItems", "minItems", "maxItems", "uniqueItems"},
    "object": {"properties", "required", "additionalProperties", "minProperties", "maxProperties",
               "propertyNames", "patternProperties"},
}


def compile_json_schema(schema, whitespace: str | None = DEFAULT_WHITESPACE,
                        allow_additional_properties: bool = True):
    """Returns (root_node, rules). ``whitespace=None`` means no whitespace at all."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError as exc:
            raise SchemaError(f"the JSON schema is not valid JSON: {exc}") from None
    if not isinstance(schema, (dict, bool)):
        raise SchemaError(f"a JSON schema must be an object or a boolean, got {type(schema).__name__}")
    try:
        compiler = _SchemaCompiler(schema, whitespace, allow_additional_properties)
        node = compiler.value(schema, "#", 0)
    except RecursionError:
        # The explicit depth check in value() catches plain nesting; this is a chain the
        # check does not count (long $ref / allOf chains, deep subschemas of keywords).
        raise SchemaError("the schema is nested or chains $ref/allOf too deeply to compile "
                          "(Python's recursion limit); flatten it") from None
    if node == ra.NOTHING:
        raise SchemaError("the schema accepts no value at all (it is unsatisfiable)")
    return node, compiler.rules


class _SchemaCompiler:
    def __init__(self, root, whitespace, allow_additional):
        self.root = root
        self.ws = ra.EMPTY if whitespace is None else parse_regex(whitespace)
        self.allow_additional = allow_additional
        self.rules: dict[str, tuple] = {}
        self._active: set[str] = set()
        self._recursive: set[str] = set()
        self._ref_cache: dict[str, tuple] = {}
        self._ids: dict[str, object] = {}
        self._anchors: dict[str, object] = {}
        self._base_of: dict[int, str] = {}
        root_base = root.get("$id", "") if isinstance(root, dict) else ""
        self._index(root, root_base)
        self._validator = None

    # ---- document index for $ref ---------------------------------------------------------
    def _index(self, schema, base: str, is_schema: bool = True) -> None:
        """Records each node's base URI; registers $id/$anchor only on nodes that are schemas
        (reached through schema keywords), so an "$id" inside an unknown keyword's value is
        not taken for an identifier."""
        if isinstance(schema, dict):
            if is_schema and isinstance(schema.get("$id"), str):
                base = urljoin(base, schema["$id"])
                self._ids[urldefrag(base)[0]] = schema
            if is_schema and isinstance(schema.get("$anchor"), str):
                self._anchors[urldefrag(base)[0] + "#" + schema["$anchor"]] = schema
            self._base_of[id(schema)] = base
            for key, sub in schema.items():
                if key in ("enum", "const", "default", "examples"):
                    continue
                if is_schema and key in SCHEMA_MAPS and isinstance(sub, dict):
                    self._base_of[id(sub)] = base
                    for value in sub.values():
                        self._index(value, base, True)
                else:
                    self._index(sub, base, is_schema and key in SCHEMA_KEYWORDS)
        elif isinstance(schema, list):
            for sub in schema:
                self._index(sub, base, is_schema)

    def _resolve(self, ref: str, schema, path: str):
        if not isinstance(ref, str):
            raise SchemaError("$ref must be a string", path)
        base = self._base_of.get(id(schema), "")
        target_uri = urljoin(base, ref) if base else ref
        doc_uri, fragment = urldefrag(target_uri)
        if doc_uri and doc_uri != urldefrag(base)[0] and doc_uri not in self._ids:
            raise SchemaError(f"remote $ref {ref!r} is not supported (only references inside "
                              "the schema document)", path)
        doc = self._ids.get(doc_uri, self.root) if doc_uri else self._document_of(base)
        if not fragment:
            return doc, target_uri
        if fragment.startswith("/"):
            return self._pointer(doc, fragment, ref, path), doc_uri + "#" + fragment
        anchor = self._anchors.get(doc_uri + "#" + fragment)
        if anchor is None:
            raise SchemaError(f"$ref {ref!r}: anchor not found", path)
        return anchor, doc_uri + "#" + fragment

    def _document_of(self, base: str):
        return self._ids.get(urldefrag(base)[0], self.root)

    def _pointer(self, doc, fragment: str, ref: str, path: str):
        node = doc
        for raw in fragment.split("/")[1:]:
            part = raw.replace("%25", "%").replace("%22", '"').replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                raise SchemaError(f"$ref {ref!r} does not resolve inside the schema", path)
        return node

    # ---- dispatch --------------------------------------------------------------------------
    def value(self, schema, path: str, depth: int) -> tuple:
        deadline.check()
        if depth > MAX_DEPTH:
            raise SchemaError(f"schema nesting deeper than {MAX_DEPTH} levels", path)
        if schema is True:
            return self._any()
        if schema is False:
            return ra.NOTHING
        if not isinstance(schema, dict):
            raise SchemaError(f"a schema must be an object or a boolean, got {type(schema).__name__}", path)
        self._check_keywords(schema, path)
        if has_conditionals(schema):
            return self.value(self._rewrite(schema, path), path, depth + 1)
        if "$ref" in schema:
            return self._ref(schema, path, depth)
        if "not" in schema:
            return self._not(schema, path, depth)
        if "allOf" in schema:
            return self.value(self._merge_all_of(schema, path, depth), path, depth + 1)
        if "anyOf" in schema or "oneOf" in schema:
            return self._alternatives(schema, path, depth)
        if "_negate" in schema:
            return self._negated(schema, path, depth)
        if "enum" in schema or "const" in schema:
            return self._enum(schema, path)
        node = self._typed(schema, path, depth)
        if schema.get("nullable") is True:
            node = ra.alt(node, ra.literal("null"))
        return node

    def _check_keywords(self, schema: dict, path: str) -> None:
        for key in schema:
            if key in UNSUPPORTED:
                value = schema[key]
                if key == "dependencies" and not value:
                    continue
                raise SchemaError(f"JSON-schema keyword {key!r} is not supported by tamis "
                                  "(it cannot be enforced while generating)", f"{path}/{key}")
        if schema.get("uniqueItems") is True and _unique_domain(schema) is None:
            raise SchemaError(f"JSON-schema keyword 'uniqueItems' is enforced only where it is "
                              f"bounded: arrays of at most one item, or items of at most "
                              f"{MAX_UNIQUE_VALUES} enumerated values (enum, const, boolean, "
                              f"null)", f"{path}/uniqueItems")

    def _not(self, schema: dict, path: str, depth: int) -> tuple:
        """Regular schema and a negated schema whose language holds *every* text of its values
        (``_every_text``): the exact difference of the languages. A difference with any other
        language would let through other texts of excluded values ("\\u0061" for "a", 1.50
        for 1.5, objects in another key order). Otherwise (recursive, free-form, or a negated schema tamis cannot compile): the
        schema intersected with json_conditionals.negate (sound, may refuse valid values)."""
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

    # ---- $ref ------------------------------------------------------------------------------
    def _ref(self, schema: dict, path: str, depth: int) -> tuple:
        target, key = self._resolve(schema["$ref"], schema, path)
        siblings = {k: v for k, v in schema.items() if k != "$ref" and k not in ANNOTATIONS}
        if siblings:
            if not isinstance(target, dict):
                target = {} if target is True else {"not": {}}
            merged = self._merge({k: v for k, v in target.items()}, siblings, path)
            return self.value(merged, path, depth + 1)
        if key in self.rules or key in self._recursive and key in self._active:
            return ("rule", key)
        if key in self._active:
            self._recursive.add(key)
            return ("rule", key)
        if key in self._ref_cache:
            return self._ref_cache[key]
        self._active.add(key)
        try:
            node = self.value(target, key, depth + 1)
        finally:
            self._active.discard(key)
        if key in self._recursive:
            self.rules[key] = node
            node = ("rule", key)
        self._ref_cache[key] = node
        return node

    # ---- if/then/else, dependencies, negation --------------------------------------------
    def _rewrite(self, schema: dict, path: str) -> dict:
        """Conditional keywords -> allOf/anyOf (json_conditionals); other schemas unchanged."""
        if not has_conditionals(schema):
            return schema
        return rewrite_conditionals(schema, self._peek, path)

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

    # ---- allOf / anyOf / oneOf -------------------------------------------------------------
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
                    raise SchemaError("recursive $ref inside allOf is not supported", path)
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
        a, b = self._rewrite(a, path), self._rewrite(b, path)
        for x, y in ((a, b), (b, a)):
            if "prefixItems" in x and "items" in y and "prefixItems" not in y:
                raise SchemaError("cannot combine 'prefixItems' and 'items' from different allOf "
                                  "branches (their meaning depends on the branch)", path)
        out = dict(a)
        for key, value in b.items():
            if key in ANNOTATIONS or key not in out:
                out.setdefault(key, value)
                continue
            merged = _merge_keyword(key, out[key], value, a, b, path)
            if merged is _UNSAT:
                return False
            out[key] = merged
        _apply_additional(out, a, b)
        _apply_additional(out, b, a)
        return out

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
            try:
                others = [negate(live[j][1], self._peek, where) for j in overlaps[i]]
            except SchemaError:
                continue                    # cannot negate: the branch is left out (sound)
            if any(o is False for o in others):
                continue                    # no instance provably fails some other branch
            out.append(self.value({"allOf": [schema] + others}, where, depth + 1))
        return ra.alt(*out)

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
        if va is not None and vb is not None and not any(_json_equal(x, y) for x in va for y in vb):
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
        ta, tb = _type_set(a.get("type")), _type_set(b.get("type"))
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

    # ---- enum / const ----------------------------------------------------------------------
    def _enum(self, schema: dict, path: str) -> tuple:
        if "const" in schema:
            values = [schema["const"]]
            if "enum" in schema:
                values = [v for v in schema["enum"] if _json_equal(v, schema["const"])]
        else:
            values = schema["enum"]
            if not isinstance(values, list):
                raise SchemaError("enum must be an array", f"{path}/enum")
        if len(values) > MAX_ENUM:
            raise SchemaError(f"enum with {len(values)} values exceeds the limit of {MAX_ENUM}", f"{path}/enum")
        rest = {k: v for k, v in schema.items() if k not in ("enum", "const") and k not in ANNOTATIONS}
        if rest:
            values = [v for v in values if self._valid(v, schema)]
        return ra.alt(*(self._literal(v) for v in values))

    def _valid(self, value, schema) -> bool:
        import jsonschema
        if self._validator is None:
            root = self.root if isinstance(self.root, dict) else {}
            cls = jsonschema.validators.validator_for(root, default=jsonschema.Draft202012Validator)
            self._validator = cls(root)
        try:
            return self._validator.evolve(schema=schema).is_valid(value)
        except jsonschema.exceptions.RefResolutionError:
            raise SchemaError("enum filtering needs a $ref that cannot be resolved") from None
        except Exception as exc:  # referencing errors have their own hierarchy
            raise SchemaError(f"cannot check enum values against the schema: {exc}") from None

    def _literal(self, value) -> tuple:
        if isinstance(value, dict):
            members = []
            for key, item in value.items():
                members.append(ra.seq(_json_string_literal(key), self.ws, ra.char(":"), self.ws,
                                      self._literal(item)))
            return self._wrap("{", members, "}")
        if isinstance(value, list):
            return self._wrap("[", [self._literal(item) for item in value], "]")
        if isinstance(value, str):
            return _json_string_literal(value)
        if isinstance(value, bool) or value is None:
            return ra.literal(json.dumps(value))
        if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
            # 1 and 1.0 are the same JSON-schema number
            return ra.seq(ra.literal(str(int(value))), parse_regex(r"(\.0+)?"))
        return ra.literal(json.dumps(value))

    def _wrap(self, open_: str, items: list, close: str) -> tuple:
        sep = ra.seq(self.ws, ra.char(","), self.ws)
        body = []
        for i, item in enumerate(items):
            body.append(item if i == 0 else ra.seq(sep, item))
        return ra.seq(ra.char(open_), self.ws, *body, self.ws, ra.char(close))

    # ---- typed values ----------------------------------------------------------------------
    def _typed(self, schema: dict, path: str, depth: int) -> tuple:
        types = schema.get("type")
        if types is None:
            constrained = {t for t, keys in TYPE_KEYWORDS.items() if keys & schema.keys()}
            if not constrained:
                return self._any()
            nodes = []
            for t in ALL_TYPES:
                if t in constrained:
                    nodes.append(self._of_type(t, schema, path, depth))
                else:
                    nodes.append(self._any_of_type(t))
            return ra.alt(*nodes)
        if isinstance(types, str):
            types = [types]
        if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
            raise SchemaError("type must be a string or an array of strings", f"{path}/type")
        unknown = [t for t in types if t not in ALL_TYPES + ("integer",)]
        if unknown:
            raise SchemaError(f"unknown type {unknown[0]!r}", f"{path}/type")
        if "number" in types and "integer" in types:
            types = [t for t in types if t != "integer"]
        return ra.alt(*(self._of_type(t, schema, path, depth) for t in types))

    def _of_type(self, t: str, schema: dict, path: str, depth: int) -> tuple:
        if t == "null":
            return ra.literal("null")
        if t == "boolean":
            return ra.alt(ra.literal("true"), ra.literal("false"))
        if t in ("integer", "number"):
            return self._number(schema, path, t == "integer")
        if t == "string":
            return self._string(schema, path)
        if t == "array":
            return self._array(schema, path, depth)
        return self._object(schema, path, depth)

    def _any_of_type(self, t: str) -> tuple:
        if t == "array":
            return self._any_rule("$any_array")
        if t == "object":
            return self._any_rule("$any_object")
        return {"null": ra.literal("null"), "boolean": ra.alt(ra.literal("true"), ra.literal("false")),
                "number": ANY_NUMBER, "string": ANY_STRING}[t]

    def _any(self) -> tuple:
        return self._any_rule("$any")

    def _any_rule(self, name: str) -> tuple:
        if "$any" not in self.rules:
            sep = ra.seq(self.ws, ra.char(","), self.ws)
            value = ("rule", "$any")
            member = ra.seq(ANY_STRING, self.ws, ra.char(":"), self.ws, value)
            self.rules["$any_array"] = ra.seq(ra.char("["), self.ws, ra.opt(ra.seq(
                value, ra.rep(ra.seq(sep, value), 0, None))), self.ws, ra.char("]"))
            self.rules["$any_object"] = ra.seq(ra.char("{"), self.ws, ra.opt(ra.seq(
                member, ra.rep(ra.seq(sep, member), 0, None))), self.ws, ra.char("}"))
            self.rules["$any"] = ra.alt(SCALARS, ("rule", "$any_array"), ("rule", "$any_object"))
        return ("rule", name)

    def _number(self, schema: dict, path: str, integer: bool) -> tuple:
        node = self._number_range(schema, path, integer)
        step = schema.get("multipleOf")
        if step is None:
            return node
        if isinstance(step, bool) or not isinstance(step, (int, float)) or step <= 0:
            raise SchemaError("multipleOf must be a positive number", f"{path}/multipleOf")
        multiple = _multiple_node(step, path)
        if ra.has_rules(node):
            raise SchemaError("multipleOf on an unbounded value", f"{path}/multipleOf")
        if integer or node is ANY_NUMBER:
            # canonical forms only: integers plain, numbers without exponent
            node = int_range(None, None) if integer else number_range(None, True, None, True)
        return ("and", node, multiple)

    def _number_range(self, schema: dict, path: str, integer: bool) -> tuple:
        lo, lo_incl, hi, hi_incl = _bounds(schema, path)
        fmt = schema.get("format")
        if integer and fmt in ("int32", "int64", "uint32", "uint64"):
            bits = int(fmt[-2:])
            f_lo, f_hi = (0, 2 ** bits - 1) if fmt.startswith("u") else (-2 ** (bits - 1), 2 ** (bits - 1) - 1)
            lo = f_lo if lo is None else max(lo, f_lo)
            hi = f_hi if hi is None else min(hi, f_hi)
        if integer:
            ilo = None if lo is None else (math.ceil(lo) if lo_incl else math.floor(lo) + 1)
            ihi = None if hi is None else (math.floor(hi) if hi_incl else math.ceil(hi) - 1)
            return int_range(ilo, ihi)
        if lo is None and hi is None:
            return ANY_NUMBER
        return number_range(lo, lo_incl, hi, hi_incl)

    def _string(self, schema: dict, path: str) -> tuple:
        lo = _nonneg_int(schema, "minLength", path, 0)
        hi = _nonneg_int(schema, "maxLength", path, None)
        if hi is not None and hi > MAX_STRING_LENGTH and lo <= MAX_STRING_LENGTH:
            hi = MAX_STRING_LENGTH
        patterns = list(schema.get("_patterns", []))
        if "pattern" in schema:
            patterns.append(schema["pattern"])
        content = None
        for pattern in patterns:
            if not isinstance(pattern, str):
                raise SchemaError("pattern must be a string", f"{path}/pattern")
            try:
                node = parse_regex(pattern, universe=SAFE_CHARS, anchored=False)
            except ConstraintError as exc:
                raise SchemaError(f"unsupported pattern: {exc}", f"{path}/pattern") from None
            content = node if content is None else ("and", content, node)
        fmt = schema.get("format")
        node = None
        if isinstance(fmt, str) and not is_annotation_only(fmt):
            node = format_node(fmt, SAFE_CHARS)
            if node is None:
                raise SchemaError(f"string format {fmt!r} is not supported by tamis", f"{path}/format")
        if node is not None:            # formats outside the specification are annotations
            if fmt in FORMAT_MAX_LENGTH:
                node = ("and", node, ra.rep(SAFE_CHAR, 0, FORMAT_MAX_LENGTH[fmt]))
            content = node if content is None else ("and", content, node)
        if content is None:
            return ra.seq(QUOTE, ra.rep(STRING_UNIT, lo, hi), QUOTE)
        if lo or hi is not None:
            content = ("and", content, ra.rep(SAFE_CHAR, lo, hi))
        return ra.seq(QUOTE, content, QUOTE)

    def _array(self, schema: dict, path: str, depth: int) -> tuple:
        lo = _nonneg_int(schema, "minItems", path, 0)
        hi = _nonneg_int(schema, "maxItems", path, None)
        if hi is not None and hi > MAX_ARRAY_ITEMS and lo <= MAX_ARRAY_ITEMS:
            hi = MAX_ARRAY_ITEMS
        items = schema.get("items", True)
        prefix = schema.get("prefixItems", [])
        if isinstance(items, list):          # draft 7 tuple form
            prefix, items = items, schema.get("additionalItems", True)
        domain = _unique_domain(schema) if schema.get("uniqueItems") is True else None
        if domain:   # every ordering of distinct values, spelled out
            return self._distinct_values(domain, schema, lo, hi)
        prefix_nodes = [self.value(p, f"{path}/prefixItems/{i}", depth + 1) for i, p in enumerate(prefix)]
        rest = self.value(items, f"{path}/items", depth + 1)
        sep = ra.seq(self.ws, ra.char(","), self.ws)
        body = _list_body(prefix_nodes, rest, lo, hi, sep)
        return ra.seq(ra.char("["), self.ws, body, self.ws, ra.char("]"))

    def _distinct_values(self, domain: list, schema: dict, lo: int, hi: int | None) -> tuple:
        """``uniqueItems`` over a small domain: arrays of distinct values, lo..hi of them."""
        values = [v for v in domain if self._valid(v, schema["items"])]
        top = len(values) if hi is None else min(hi, len(values))
        sep = ra.seq(self.ws, ra.char(","), self.ws)
        arrays = []
        for size in range(lo, top + 1):
            for chosen in itertools.permutations(values, size):
                body = [self._literal(v) if i == 0 else ra.seq(sep, self._literal(v))
                        for i, v in enumerate(chosen)]
                arrays.append(ra.seq(ra.char("["), self.ws, *body, self.ws, ra.char("]")))
        return ra.alt(*arrays)

    def _object(self, schema: dict, path: str, depth: int) -> tuple:
        props = schema.get("properties", {})
        if not isinstance(props, dict):
            raise SchemaError("properties must be an object", f"{path}/properties")
        required = schema.get("required", [])
        if not isinstance(required, list):
            raise SchemaError("required must be an array", f"{path}/required")
        patterns = schema.get("patternProperties", {})
        names_schema = schema.get("propertyNames", True)
        extra_schema = schema.get("additionalProperties", True)
        if not self.allow_additional and "additionalProperties" not in schema:
            extra_schema = False
        names = list(props) + [n for n in required if n not in props]
        sep = ra.seq(self.ws, ra.char(","), self.ws)
        members = []
        for name in names:
            sub = self._member_schema(name, props, patterns, extra_schema, path)
            allowed_name = names_schema is True or self._valid(name, names_schema)
            value = self.value(sub, f"{path}/properties/{_escape_pointer(name)}", depth + 1) \
                if allowed_name else ra.NOTHING
            if value == ra.NOTHING:
                if name in required:
                    return ra.NOTHING
                continue
            key = _json_string_literal(name)
            members.append((ra.seq(key, self.ws, ra.char(":"), self.ws, value), name in required))
        extra = self._extra_members(names, patterns, extra_schema, names_schema, path, depth)
        lo = _nonneg_int(schema, "minProperties", path, 0)
        hi = _nonneg_int(schema, "maxProperties", path, None)
        required_count = sum(1 for _, req in members if req)
        if hi is not None and hi < required_count:
            return ra.NOTHING
        if hi is None or hi >= len(members):
            bodies = [_members_body(tuple(members), sep, extra, lo, hi, path)]
        else:
            # maxProperties below the declared count: one alternative per set of optional
            # members that fits (those members become required in it)
            optional = [k for k, (_, req) in enumerate(members) if not req]
            choices = [c for size in range(hi - required_count + 1)
                       for c in itertools.combinations(optional, size)]
            if len(choices) > MAX_MEMBER_CHOICES:
                raise SchemaError("maxProperties well below the number of declared properties is "
                                  "not supported", f"{path}/maxProperties")
            bodies = [_members_body(tuple((node, True) for k, (node, req) in enumerate(members)
                                          if req or k in chosen), sep, extra, lo, hi, path)
                      for chosen in choices]
        return ra.seq(ra.char("{"), self.ws, ra.alt(*bodies), self.ws, ra.char("}"))

    def _member_schema(self, name: str, props: dict, patterns: dict, extra_schema, path: str):
        """A declared (or required) property's schema, with every matching patternProperty."""
        matching = [sub for pattern, sub in patterns.items() if _search(pattern, name, path)]
        base = props[name] if name in props else (extra_schema if not matching else True)
        return {"allOf": [base] + matching} if matching else base

    def _extra_members(self, names, patterns, extra_schema, names_schema, path, depth) -> tuple:
        """Members whose key is not declared: keys matching one pattern take its schema, the
        others take additionalProperties. Keys matching two patterns are left out (sound)."""
        free_key = _string_not_in(names, path)
        if names_schema is not True:
            as_string = {"allOf": [names_schema, {"type": "string"}]} \
                if isinstance(names_schema, dict) else names_schema   # keys are strings
            name_node = self.value(as_string, f"{path}/propertyNames", depth + 1)
            if ra.has_rules(name_node):
                raise SchemaError("propertyNames must be a string schema", f"{path}/propertyNames")
            free_key = ("and", ra.seq(QUOTE, free_key, QUOTE), name_node)
        else:
            free_key = ra.seq(QUOTE, free_key, QUOTE)
        pattern_nodes = []
        for pattern in patterns:
            try:
                node = parse_regex(pattern, universe=SAFE_CHARS, anchored=False)
            except ConstraintError as exc:
                raise SchemaError(f"unsupported patternProperties pattern: {exc}",
                                  f"{path}/patternProperties") from None
            pattern_nodes.append(ra.seq(QUOTE, node, QUOTE))
        alternatives = []
        for i, (pattern, sub) in enumerate(patterns.items()):
            key = ("and", free_key, pattern_nodes[i])
            others = [n for j, n in enumerate(pattern_nodes) if j != i]
            if others:
                key = ("diff", key, ra.alt(*others))
            value = self.value(sub, f"{path}/patternProperties/{_escape_pointer(pattern)}", depth + 1)
            if value != ra.NOTHING:
                alternatives.append(ra.seq(key, self.ws, ra.char(":"), self.ws, value))
        value = self.value(extra_schema, f"{path}/additionalProperties", depth + 1)
        if value != ra.NOTHING:
            key = ("diff", free_key, ra.alt(*pattern_nodes)) if pattern_nodes else free_key
            alternatives.append(ra.seq(key, self.ws, ra.char(":"), self.ws, value))
        return ra.alt(*alternatives)


# ---- helpers ---------------------------------------------------------------------------------
_UNSAT = object()


def _common_multiple(x, y):
    """The least common multiple of two positive steps, exact for decimals (2 and 3 -> 6,
    0.5 and 0.3 -> 1.5): a number is a multiple of both iff it is a multiple of it."""
    fx, fy = Fraction(str(x)), Fraction(str(y))
    step = Fraction(math.lcm(fx.numerator, fy.numerator), math.gcd(fx.denominator, fy.denominator))
    return int(step) if step.denominator == 1 else float(step)


def _merge_keyword(key, x, y, a, b, path):
    if key == "properties":
        out = dict(x)
        for name, sub in y.items():
            out[name] = {"allOf": [out[name], sub]} if name in out else sub
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
        kept = [v for v in x if any(_json_equal(v, w) for w in y)]
        return kept if kept else _UNSAT
    if key == "const":
        return x if _json_equal(x, y) else _UNSAT
    if key == "pattern":
        if x == y:
            return x
        a.setdefault("_patterns", [])
        return x if False else _merge_patterns(a, x, y)
    if key in ("items", "additionalProperties", "additionalItems"):
        if isinstance(x, dict) and isinstance(y, dict) or isinstance(x, bool) or isinstance(y, bool):
            if x is True:
                return y
            if y is True:
                return x
            if x is False or y is False:
                return False
            return {"allOf": [x, y]}
    if key == "anyOf":
        return [{"allOf": [p, q]} for p in x for q in y]
    if key == "allOf":
        return list(x) + list(y)
    if key == "not":
        return {"anyOf": [x, y]}
    if key == "_negate":
        return list(x) + list(y)
    if key == "patternProperties":
        out = dict(x)
        for pattern, sub in y.items():
            out[pattern] = {"allOf": [out[pattern], sub]} if pattern in out else sub
        return out
    if key not in HANDLED and key not in UNSUPPORTED:
        return x                           # an annotation or unknown keyword: no effect
    if json.dumps(x, sort_keys=True) == json.dumps(y, sort_keys=True):
        return x
    raise SchemaError(f"cannot combine two different values of {key!r} in allOf", path)


def _merge_patterns(a, x, y):
    # Two patterns must both hold: keep one and record the other for the string compiler.
    a["_patterns"] = a.get("_patterns", []) + [y]
    return x


def _apply_additional(out: dict, side: dict, other: dict) -> None:
    """allOf: a side's additionalProperties also governs the other side's extra property names."""
    extra = side.get("additionalProperties", True)
    if extra is True:
        return
    if set(other.get("patternProperties", {})) - set(side.get("patternProperties", {})):
        raise SchemaError("allOf: additionalProperties in one branch and patternProperties in "
                          "another cannot be combined")
    own = set(side.get("properties", {}))
    props = dict(out.get("properties", {}))
    for name in other.get("properties", {}):
        if name not in own:
            props[name] = {"allOf": [props[name], extra]} if name in props else extra
    for name in other.get("required", []):
        if name not in own and name not in props:
            props[name] = extra
    if props:
        out["properties"] = props


def _bounds(schema: dict, path: str):
    lo, lo_incl, hi, hi_incl = None, True, None, True
    for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        value = schema.get(key)
        if value is None or isinstance(value, bool):
            continue
        if not isinstance(value, (int, float)):
            raise SchemaError(f"{key} must be a number", f"{path}/{key}")
    if isinstance(schema.get("minimum"), (int, float)) and not isinstance(schema["minimum"], bool):
        lo = schema["minimum"]
    if isinstance(schema.get("maximum"), (int, float)) and not isinstance(schema["maximum"], bool):
        hi = schema["maximum"]
    ex_lo, ex_hi = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    if ex_lo is True:            # draft 4 boolean form
        lo_incl = False
    elif isinstance(ex_lo, (int, float)) and not isinstance(ex_lo, bool) and (lo is None or ex_lo >= lo):
        lo, lo_incl = ex_lo, False
    if ex_hi is True:
        hi_incl = False
    elif isinstance(ex_hi, (int, float)) and not isinstance(ex_hi, bool) and (hi is None or ex_hi <= hi):
        hi, hi_incl = ex_hi, False
    return lo, lo_incl, hi, hi_incl


def _multiple_node(step, path: str) -> tuple:
    """Numbers (either sign, no exponent) that are integer multiples of ``step``."""
    from decimal import Decimal
    exact = Decimal(repr(step)) if isinstance(step, float) else Decimal(step)
    p = max(0, -exact.as_tuple().exponent)
    m = int(exact * (10 ** p))
    unsigned = ("multiple", m, p)
    zero = parse_regex(r"0(\.0+)?")
    return ra.alt(unsigned, ra.seq(ra.char("-"), ("diff", unsigned, zero)))


def _nonneg_int(schema: dict, key: str, path: str, default):
    value = schema.get(key, default)
    if value is default:
        return value
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise SchemaError(f"{key} must be a non-negative integer", f"{path}/{key}")
    return value


def _members_body(members: tuple, sep, extra, lo: int, hi, path: str) -> tuple:
    """Declared ``members`` then extras, with at most ``hi`` properties in all (optional
    members counted as present: sound) and at least ``lo`` (only 1 beyond the required ones
    is supported: then an object with no member must carry an extra)."""
    required_count = sum(1 for _, req in members if req)
    extra_hi = None if hi is None else hi - len(members)
    if extra == ra.NOTHING or extra_hi == 0:
        tail_some, first = ra.EMPTY, ra.NOTHING
    else:
        tail_some = ra.rep(ra.seq(sep, extra), 0, extra_hi)
        first = ra.seq(extra, ra.rep(ra.seq(sep, extra), 0, None if extra_hi is None else extra_hi - 1))
    tail_none = ra.alt(ra.EMPTY, first)
    if lo > required_count:
        if lo > 1:
            raise SchemaError("minProperties above 1 (beyond the required properties) is "
                              "not supported", f"{path}/minProperties")
        tail_none = first                  # nothing emitted yet: an extra must come
    return ("props", members, sep, tail_none, tail_some) if members else tail_none


def _list_body(prefix: list, rest, lo: int, hi, sep) -> tuple:
    """Array elements: position i uses prefix[i] if any, else ``rest``; count in [lo, hi]."""
    if hi is not None and hi < lo:
        return ra.NOTHING
    k = len(prefix)
    nodes_after = _rest_items(rest, lo - k, None if hi is None else hi - k, sep, leading=k > 0)
    tail = nodes_after
    for i in range(k - 1, -1, -1):
        element = prefix[i] if i == 0 else ra.seq(sep, prefix[i])
        if hi is not None and i >= hi:
            tail = ra.EMPTY
            continue
        with_element = ra.seq(element, tail)
        tail = with_element if i < lo else ra.alt(with_element, ra.EMPTY)
    return tail


def _rest_items(rest, lo: int, hi, sep, leading: bool) -> tuple:
    lo = max(lo, 0)
    if (hi is not None and hi <= 0) or rest == ra.NOTHING:
        return ra.EMPTY if lo == 0 else ra.NOTHING
    more_hi = None if hi is None else hi - 1
    if leading:
        return ra.rep(ra.seq(sep, rest), lo, hi)
    following = ra.rep(ra.seq(sep, rest), max(lo - 1, 0), more_hi)
    first = ra.seq(rest, following)
    return first if lo > 0 else ra.opt(first)


def _json_string_literal(text: str) -> tuple:
    return ra.literal(json.dumps(text, ensure_ascii=False))


def _string_not_in(names: list, path: str) -> tuple:
    """String content (escapes allowed) that is not the JSON form of any of ``names``."""
    any_content = ra.rep(STRING_UNIT, 0, None)
    encoded = [json.dumps(n, ensure_ascii=False)[1:-1] for n in names]
    if not encoded:
        return any_content
    if any("\\" in e for e in encoded):
        raise SchemaError("additional properties next to property names that need JSON escapes "
                          "are not supported", path)
    trie: dict = {}
    for e in encoded:
        node = trie
        for c in e:
            node = node.setdefault(c, {})
        node[None] = True

    def build(node) -> tuple:
        used = [(ord(c), ord(c)) for c in node if c is not None]
        others = ("chars", ra.intersect_ranges(ra.negate_ranges(used), SAFE_CHARS))
        branches = [ra.seq(ra.alt(others, ESCAPE), any_content)]
        branches += [ra.seq(ra.char(c), build(child)) for c, child in node.items() if c is not None]
        if None not in node:
            branches.append(ra.EMPTY)
        return ra.alt(*branches)
    return build(trie)


def _search(pattern: str, name: str, path: str) -> bool:
    import re
    try:
        return re.search(pattern, name) is not None
    except re.error as exc:
        raise SchemaError(f"invalid patternProperties pattern {pattern!r}: {exc}",
                          f"{path}/patternProperties") from None


def _escape_pointer(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")


def _every_text(schema) -> bool:
    """True if tamis's language for ``schema`` contains every JSON text of each value it
    accepts (so a difference with it is exact): plain null/boolean/number/string types with
    at most string length bounds (uncapped)."""
    if not isinstance(schema, dict):
        return False
    keys = {k for k in schema if k not in ANNOTATIONS}
    types = _type_set(schema.get("type"))
    if "type" not in keys or types is None or "integer" in _as_list(schema["type"]) \
            or not types <= {"null", "boolean", "number", "string"}:
        return False
    if not keys <= {"type", "minLength", "maxLength"}:
        return False
    return not isinstance(schema.get("maxLength"), (int, float)) or schema["maxLength"] <= MAX_STRING_LENGTH


def _as_list(value) -> list:
    return value if isinstance(value, list) else [value]


def _type_set(types) -> set | None:
    """JSON types a ``type`` keyword admits ("integer" widened to "number"), None if absent."""
    if types is None:
        return None
    names = {types} if isinstance(types, str) else set(types) if isinstance(types, list) else None
    if names is None or not all(isinstance(t, str) for t in names):
        return None
    return {"number" if t == "integer" else t for t in names}


def _json_equal(x, y) -> bool:
    if isinstance(x, bool) or isinstance(y, bool):
        return type(x) is type(y) and x == y
    if isinstance(x, (int, float)) and isinstance(y, (int, float)):
        return x == y
    if isinstance(x, list) and isinstance(y, list):
        return len(x) == len(y) and all(_json_equal(p, q) for p, q in zip(x, y))
    if isinstance(x, dict) and isinstance(y, dict):
        return x.keys() == y.keys() and all(_json_equal(x[k], y[k]) for k in x)
    return x == y


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


def _canonical_literal(value) -> tuple:
    """The canonical text of a scalar (see CANONICAL)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        from decimal import Decimal
        if isinstance(value, float) and not math.isfinite(value):
            return ra.NOTHING
        text = format(Decimal(repr(value) if isinstance(value, float) else value).normalize(), "f")
        return ra.literal("0" if text in ("-0", "0") else text)
    return ra.literal(json.dumps(value, ensure_ascii=False))


def _unique_domain(schema: dict) -> list | None:
    """What makes ``uniqueItems`` enforceable for this array schema: [] when at most one item
    fits (nothing to enforce), the item values when the items are a small finite set of
    scalars, else None."""
    if "prefixItems" in schema or isinstance(schema.get("items"), list):
        return None
    if isinstance(schema.get("maxItems"), int) and schema["maxItems"] <= 1:
        return []
    items = schema.get("items")
    if not isinstance(items, dict) or set(items) - {"enum", "const", "type"} - ANNOTATIONS:
        return None
    if "const" in items:
        values = [items["const"]]
    elif "enum" in items and isinstance(items["enum"], list):
        values = items["enum"]
    elif items.get("type") == "boolean":
        values = [True, False]
    elif items.get("type") == "null":
        values = [None]
    else:
        return None
    if not all(v is None or isinstance(v, (bool, int, str)) for v in values):
        return None
    distinct = list(dict.fromkeys((type(v) is bool, v) for v in values))   # 1 and True differ
    if len(distinct) > MAX_UNIQUE_VALUES:
        return None
    return [v for _, v in distinct] or None
