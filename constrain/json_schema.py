"""JSON schema -> regex AST (plus grammar rules where the schema is recursive): the entry
point, the dispatch on a schema's keywords, enum/const values and values of any shape. Each
other concern has its module: ``json_refs`` ($ref), ``json_merge`` (allOf),
``json_combinators`` (anyOf/oneOf/not), ``json_conditionals`` (if/then/else, dependencies),
``json_objects``, ``json_arrays``, ``json_strings`` (with ``json_formats``), ``json_numbers``;
``json_keywords`` lists the vocabulary.

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
  require with disjoint values, a required name the other forbids) are an alternation; an
  overlapping branch with finitely many values keeps those no overlapping branch accepts; any
  other branch is intersected with the negation of the branches it may overlap (sound);
- **conditionals** (``if``/``then``/``else``, ``dependentRequired``, ``dependentSchemas``,
  ``dependencies``) and ``not`` around recursive or free-form schemas: rewritten into
  allOf/anyOf by ``json_conditionals`` (negation exact for type/const/enum/required/
  properties/bounds, otherwise an under-approximation: sound, may refuse valid values);
- **long bounds**: ``maxLength`` above 256 and ``maxItems`` above 128 are enforced as 256 / 128
  (sound: outputs still satisfy the schema; longer valid values are refused).

``uniqueItems: true`` is spelled out in the automaton for arrays of one item and enumerated
items with at most ``MAX_UNIQUE_ORDERINGS`` orderings, and enforced beside the matcher
(``unique_items``) for strings of unbounded length.

Keywords that constrain values but cannot be enforced (``uniqueItems: true`` elsewhere,
``contains`` where ``json_contains`` cannot build it, ``unevaluated*``, ``$dynamicRef``, remote ``$ref``, formats
of the specification tamis has no regex for...) raise ``SchemaError`` naming the keyword and its JSON pointer. Keywords that only
annotate (``title``, ``description``, ``default``, ``examples``, unknown keywords, formats
outside the specification) are ignored.
"""
from __future__ import annotations

import json

from . import deadline
from . import regex_ast as ra
from .errors import SchemaError
from .json_arrays import MAX_ARRAY_ITEMS, MAX_UNIQUE_ORDERINGS, ArraySchemas, unique_domain
from .json_combinators import Combinators
from .json_contains import ContainsSchemas
from .json_conditionals import has_conditionals
from .json_content import ContentIds
from .json_keywords import (ALL_TYPES, ANNOTATIONS, MAX_DEPTH, TYPE_KEYWORDS, UNSUPPORTED,
                            as_json_schema, json_equal)
from .json_merge import SchemaMerging
from .json_numbers import ANY_NUMBER, number_schema
from .json_objects import ObjectSchemas
from .json_positions import SchemaPositions
from .json_refs import SchemaReferences
from .json_strings import ANY_STRING, MAX_STRING_LENGTH, json_string_literal, string_schema
from .regex_parser import parse_regex

DEFAULT_WHITESPACE = r"(\r?\n)?[ \t]{0,20}"
SCALARS = ra.alt(ra.literal("null"), ra.literal("true"), ra.literal("false"), ANY_NUMBER, ANY_STRING)
MAX_ENUM = 100_000           # an enum compiles in linear time; the compile time limit still holds
COMBINING = frozenset({"allOf", "anyOf", "oneOf", "not", "_anyofs", "_oneofs", "_negate"})


def compile_json_schema(schema, whitespace: str | None = DEFAULT_WHITESPACE,
                        allow_additional_properties: bool = True, unique_strings: list | None = None):
    """Returns (root_node, rules). ``whitespace=None`` means no whitespace at all.

    ``uniqueItems`` over strings of unbounded length is left out of the automaton when the
    caller passes a list as ``unique_strings`` and enforces it beside the matcher
    (``unique_items``): the list then receives the document's ``SchemaPositions``. Without
    the list such a schema is refused."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError as exc:
            raise SchemaError(f"the JSON schema is not valid JSON: {exc}") from None
    if not isinstance(schema, (dict, bool)):
        raise SchemaError(f"a JSON schema must be an object or a boolean, got {type(schema).__name__}")
    # Deep nesting raises RecursionError: compile_constraint retries on a deep stack.
    compiler = _SchemaCompiler(schema, whitespace, allow_additional_properties,
                               unique_strings_allowed=unique_strings is not None)
    node = compiler.value(schema, "#", 0)
    if node == ra.NOTHING:
        if compiler.left_out:    # not unsatisfiable: its values are ones tamis leaves out
            raise compiler.left_out[0]
        raise SchemaError("the schema accepts no value at all (it is unsatisfiable)")
    if compiler.unique_strings_met:
        unique_strings.append(SchemaPositions(schema))
    return node, compiler.rules


class _SchemaCompiler(SchemaReferences, SchemaMerging, Combinators, ObjectSchemas, ArraySchemas,
                      ContainsSchemas):
    """One schema document compiled: ``value(schema, path, depth)`` is the node of a subschema
    (``path`` its JSON pointer, for errors); ``rules`` collects the grammar rules it needs."""

    def __init__(self, root, whitespace, allow_additional, unique_strings_allowed: bool = False):
        self.root = root
        self.ws = ra.EMPTY if whitespace is None else parse_regex(whitespace)
        self.allow_additional = allow_additional
        self.rules: dict[str, tuple] = {}
        self.left_out: list[SchemaError] = []   # shapes left out (sound), with their reasons
        self._validator = None
        self._index_document()
        self.unique_strings_allowed = unique_strings_allowed   # see compile_json_schema
        self.unique_strings_met = False
        # one base URI: a subschema's language depends on its content only (see _cache_key)
        single_base = len(set(self._base_of.values())) <= 1
        self._content_ids = ContentIds() if single_base else None
        self._content_cache: dict[int, tuple] = {}
        self._tree_sizes: dict = {}       # ArraySchemas._unfolded_size's memo, and the
        self._sized: list = []            # nodes it keeps alive

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
        key = self._cache_key(schema)
        if key is not None and key in self._content_cache:
            return self._content_cache[key]
        node = self._value_of(schema, path, depth)
        if key is not None:
            self._content_cache[key] = node
        return node

    def _cache_key(self, schema: dict) -> int | None:
        """The content of a combining subschema (allOf / anyOf / oneOf / not and what merges
        leave pending): merges and $refs with siblings build equal ones afresh, and each costs
        a full compile. None where there is no cache (several base URIs: a relative $ref
        then resolves by where its subschema sits) or the subschema is cheap."""
        if self._content_ids is None or not COMBINING.intersection(schema):
            return None
        return self._content_ids.of(schema)

    def _value_of(self, schema: dict, path: str, depth: int) -> tuple:
        self._check_keywords(schema, path)
        if has_conditionals(schema):
            return self.value(self._rewrite(schema, path), path, depth + 1)
        for pending, keyword in (("_anyofs", "anyOf"), ("_oneofs", "oneOf")):
            if pending in schema and keyword not in schema:   # see json_merge
                schema = _next_alternatives(schema, pending, keyword)
        if "$ref" in schema:
            return self._ref(schema, path, depth)
        if "not" in schema:
            return self._not(schema, path, depth)
        if "allOf" in schema:
            named = self._all_of_key(schema, path)
            if named is not None:
                return self._named(named, self._merge_all_of(schema, path, depth), path, depth)
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
        if schema.get("uniqueItems") is True and unique_domain(schema) is None:
            if self.unique_strings_allowed and self._unbounded_string_items(schema, path):
                self.unique_strings_met = True
                return
            raise SchemaError(f"JSON-schema keyword 'uniqueItems' is enforced only for arrays of "
                              f"at most one item, items of enumerated scalars (enum, const, boolean, "
                              f"null) with at most {MAX_UNIQUE_ORDERINGS} arrays of distinct values "
                              f"(lower maxItems or the values), and strings with no maxLength, "
                              f"pattern or format in a response format (not in a structural tag)",
                              f"{path}/uniqueItems")

    def _unbounded_string_items(self, schema: dict, path: str) -> bool:
        """Items that are strings with no upper length, pattern, format or value list: every
        prefix of one has endlessly many completions, so ``unique_items`` can always leave a
        distinct one."""
        if "prefixItems" in schema or "contains" in schema:
            return False
        try:
            items = self._peek(schema.get("items"), f"{path}/items")
        except SchemaError:
            return False
        if not isinstance(items, dict) or items.get("type") not in ("string", ["string"]):
            return False
        return set(items) - ANNOTATIONS <= {"type", "minLength"}

    # ---- enum / const ----------------------------------------------------------------------
    def _enum(self, schema: dict, path: str) -> tuple:
        if "const" in schema:
            values = [schema["const"]]
            if "enum" in schema:
                values = [v for v in schema["enum"] if json_equal(v, schema["const"])]
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

    def _valid(self, value, schema, formats: bool = False) -> bool:
        """``value`` meets ``schema`` (``$ref``s resolved in the root document); with
        ``formats``, ``format`` is asserted too (the validator's default: annotations)."""
        import jsonschema
        if self._validator is None:
            root = self.root if isinstance(self.root, dict) else {}
            cls = jsonschema.validators.validator_for(root, default=jsonschema.Draft202012Validator)
            self._validator = cls(root)
        try:
            validator = self._validator.evolve(schema=as_json_schema(schema))
            if formats:
                validator = validator.evolve(format_checker=validator.FORMAT_CHECKER)
            return validator.is_valid(value)
        except jsonschema.exceptions.RefResolutionError:
            raise SchemaError("enum filtering needs a $ref that cannot be resolved") from None
        except Exception as exc:  # referencing errors have their own hierarchy
            raise SchemaError(f"cannot check enum values against the schema: {exc}") from None

    def _literal(self, value) -> tuple:
        if isinstance(value, dict):
            members = []
            for key, item in value.items():
                members.append(ra.seq(json_string_literal(key), self.ws, ra.char(":"), self.ws,
                                      self._literal(item)))
            return self._wrap("{", members, "}")
        if isinstance(value, list):
            return self._wrap("[", [self._literal(item) for item in value], "]")
        if isinstance(value, str):
            return json_string_literal(value)
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
            return number_schema(schema, path, t == "integer")
        if t == "string":
            return string_schema(schema, path)
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


def _next_alternatives(schema: dict, pending: str, keyword: str) -> dict:
    """``schema`` with the first of its ``pending`` lists (an allOf of several anyOf or oneOf,
    json_merge) as its ``keyword``; each branch is then merged with the rest, the others
    still pending."""
    first, *rest = schema[pending]
    out = {k: v for k, v in schema.items() if k != pending}
    out[keyword] = first
    if rest:
        out[pending] = rest
    return out


__all__ = ["compile_json_schema", "DEFAULT_WHITESPACE", "MAX_STRING_LENGTH", "MAX_ARRAY_ITEMS",
           "MAX_UNIQUE_ORDERINGS", "MAX_ENUM", "MAX_DEPTH"]
