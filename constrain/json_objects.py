"""JSON objects: ``properties``/``required``, ``additionalProperties``,
``patternProperties``, ``propertyNames``, ``minProperties``/``maxProperties``.

Policies: declared properties appear in schema order and optional ones may be skipped;
additional properties (allowed unless ``additionalProperties: false`` or the request sets
``disable_additional_properties``) come after the declared ones; a key matching two
``patternProperties`` is left out (sound); ``maxProperties`` below the declared count is
enumerated up to ``MAX_MEMBER_CHOICES`` alternatives."""
from __future__ import annotations

import functools
import itertools

from . import regex_ast as ra
from .errors import ConstraintError, SchemaError
from .json_keywords import nonneg_int
from .json_strings import QUOTE, SAFE_CHARS, json_string_literal, string_not_in
from .json_witnesses import Witnesses
from .regex_parser import parse_regex

MAX_MEMBER_CHOICES = 64      # maxProperties below the declared count: alternatives enumerated


class ObjectSchemas(Witnesses):
    """``type: object`` for ``_SchemaCompiler``, a mixin: the host provides ``value(schema,
    path, depth)``, ``ws`` (the whitespace node), ``allow_additional`` and
    ``_valid(value, schema, formats)``; members the object must contain (``_some``) are
    ``json_witnesses``'s."""

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
        members, declared = [], []
        for name in names:
            sub = self._member_schema(name, props, patterns, extra_schema, path)
            allowed_name = names_schema is True or self._valid(name, names_schema)
            where = f"{path}/properties/{_escape_pointer(name)}"
            value = self.value(sub, where, depth + 1) if allowed_name else ra.NOTHING
            if value == ra.NOTHING:
                if name in required:
                    return ra.NOTHING
                continue
            members.append((self._member(name, value), name in required))
            declared.append((name, sub, where))
        kinds = self._extra_kinds(names, patterns, extra_schema, names_schema, path, depth)
        extra = ra.alt(*(ra.seq(key, self.ws, ra.char(":"), self.ws, value) for key, _, value in kinds))
        lo = nonneg_int(schema, "minProperties", path, 0)
        hi = nonneg_int(schema, "maxProperties", path, None)
        required_count = sum(1 for _, req in members if req)
        if hi is not None and hi < required_count:
            return ra.NOTHING
        if schema.get("_some"):
            plain = functools.partial(_members_body, sep=sep, extra=extra, lo=lo, hi=hi, path=path)
            bodies = self._bodies_with_some(schema["_some"], members, declared, kinds,
                                            (sep, extra, lo, hi, plain), path, depth)
        elif hi is None or hi >= len(members):
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

    def _member(self, name: str, value) -> tuple:
        return ra.seq(json_string_literal(name), self.ws, ra.char(":"), self.ws, value)

    def _extra_kinds(self, names, patterns, extra_schema, names_schema, path, depth) -> list:
        """(key node, value schema, value node) of each kind of member whose key is not
        declared: keys matching one pattern take its schema, the others additionalProperties.
        Keys matching two patterns are left out (sound); kinds with no value are dropped."""
        free_key = string_not_in(names, path)
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
        kinds = []
        for i, (pattern, sub) in enumerate(patterns.items()):
            key = ("and", free_key, pattern_nodes[i])
            others = [n for j, n in enumerate(pattern_nodes) if j != i]
            if others:
                key = ("diff", key, ra.alt(*others))
            kinds.append((key, sub, f"{path}/patternProperties/{_escape_pointer(pattern)}"))
        key = ("diff", free_key, ra.alt(*pattern_nodes)) if pattern_nodes else free_key
        kinds.append((key, extra_schema, f"{path}/additionalProperties"))
        out = []
        for key, sub, where in kinds:
            value = self.value(sub, where, depth + 1)
            if value != ra.NOTHING:
                out.append((key, (sub, where), value))
        return out


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


def _search(pattern: str, name: str, path: str) -> bool:
    import re
    try:
        return re.search(pattern, name) is not None
    except re.error as exc:
        raise SchemaError(f"invalid patternProperties pattern {pattern!r}: {exc}",
                          f"{path}/patternProperties") from None


def _escape_pointer(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")
