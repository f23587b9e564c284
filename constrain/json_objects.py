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
    ``json_witnesses``'s. Objects the policies leave out (``NeedsExtras``) add their
    reason to ``left_out`` (the host's list)."""

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
        plain = functools.partial(_members_bodies, sep=sep, extra=extra, lo=lo, hi=hi, path=path)
        try:
            if schema.get("_some"):
                bodies = self._bodies_with_some(schema["_some"], members, declared, kinds,
                                                (sep, extra, lo, hi, plain), path, depth)
            else:
                bodies = [plain(tuple(members))]
        except NeedsExtras as exc:    # sound to leave out; the reason if nothing else is left
            self.left_out.append(exc)
            return ra.NOTHING
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


def _member_choices(members: list, lo: int, hi, extras_possible: bool, path: str) -> list:
    """(members, least) alternatives whose union is the objects with ``lo``..``hi`` members
    that these policies emit; ``least`` is what the tail of extras must add (``_body_of``).

    - ``maxProperties`` below the declared count: one alternative per set of optional members
      that fits (those become required in it), keeping the sets that reach ``lo`` (or reach
      it with one extra member).
    - ``minProperties`` above the required count: one alternative per choice of the *first*
      ``need`` optional members present (those before the last of them are left out, those
      chosen become required), and, where extras may come, one per choice of the first
      ``need - 1`` with at least one extra. Extra keys may repeat one another but never a
      declared name, so only one extra is counted towards ``lo`` (sound: an object that
      needs two extras to reach ``lo`` is not emitted).
    """
    members = list(members)
    required_count = sum(1 for _, req in members if req)
    optional = [k for k, (_, req) in enumerate(members) if not req]
    need = lo - required_count
    if hi is not None and hi < len(members):
        choices = [c for size in range(hi - required_count + 1)
                   for c in itertools.combinations(optional, size)]
        if len(choices) > MAX_MEMBER_CHOICES:
            raise SchemaError("maxProperties well below the number of declared properties is "
                              "not supported", f"{path}/maxProperties")
        out = []
        for chosen in choices:
            kept = tuple((node, True) for k, (node, req) in enumerate(members)
                         if req or k in chosen)
            if len(kept) >= lo:
                out.append((kept, ""))
            elif len(kept) + 1 == lo and extras_possible:
                out.append((kept, "extra"))
        if not out and extras_possible and lo <= hi:
            raise _needs_extras(lo, path)
        return out
    if need <= 0:
        return [(tuple(members), "")]
    if need == 1 and required_count == 0:
        return [(tuple(members), "one")]
    if extras_possible and need - 1 > len(optional):
        raise _needs_extras(lo, path)
    firsts = list(itertools.combinations(optional, need))
    firsts_with_extra = list(itertools.combinations(optional, need - 1)) if extras_possible else []
    if len(firsts) + len(firsts_with_extra) > MAX_MEMBER_CHOICES:
        raise SchemaError(f"minProperties {lo} is too far above the {required_count} required "
                          f"properties among {len(members)} declared ones to enumerate",
                          f"{path}/minProperties")
    return ([(_first_present(members, chosen), "") for chosen in firsts]
            + [(_first_present(members, chosen), "extra") for chosen in firsts_with_extra])


class NeedsExtras(SchemaError):
    """Objects of this shape are left out: they would need two or more additional properties."""


def _needs_extras(lo: int, path: str) -> NeedsExtras:
    return NeedsExtras(f"minProperties {lo} can only be met with two or more additional "
                       f"properties, whose keys the constraint cannot keep apart; declare "
                       f"properties for them", f"{path}/minProperties")


def _first_present(members: list, chosen: tuple) -> tuple:
    """``members`` where the optional ones in ``chosen`` are the first present: chosen ones
    become required, optional ones before the last chosen are left out."""
    last = max(chosen, default=-1)
    return tuple((node, True) if req or k in chosen else (node, False)
                 for k, (node, req) in enumerate(members) if req or k in chosen or k > last)


def _body_of(members: tuple, sep, extra, hi, least: str) -> tuple:
    """Declared ``members`` then extras, with at most ``hi`` properties in all (optional
    members counted as present: sound). ``least``: "" no more; "one" at least one member
    (an object with no declared member must carry an extra); "extra" at least one extra."""
    extra_hi = None if hi is None else hi - len(members)
    if extra == ra.NOTHING or extra_hi == 0:
        if least == "extra":
            return ra.NOTHING
        tail_some, first = ra.EMPTY, ra.NOTHING
    else:
        more_hi = None if extra_hi is None else extra_hi - 1
        more = ra.rep(ra.seq(sep, extra), 0, more_hi)
        first = ra.seq(extra, more)
        if least == "extra":
            tail_some = ra.seq(sep, first)
        else:   # unbounded: the same node ends both tails (``ra.props_shared_tail``)
            tail_some = more if extra_hi is None else ra.rep(ra.seq(sep, extra), 0, extra_hi)
    tail_none = first if least in ("one", "extra") else ra.alt(ra.EMPTY, first)
    return ("props", members, sep, tail_none, tail_some) if members else tail_none


def _members_bodies(members: tuple, sep, extra, lo: int, hi, path: str) -> tuple:
    """Declared ``members`` then extras, ``lo``..``hi`` properties in all: the alternatives
    of ``_member_choices``."""
    return ra.alt(*(_body_of(chosen, sep, extra, hi, least) for chosen, least
                    in _member_choices(members, lo, hi, extra != ra.NOTHING, path)))


def _search(pattern: str, name: str, path: str) -> bool:
    import re
    try:
        return re.search(pattern, name) is not None
    except re.error as exc:
        raise SchemaError(f"invalid patternProperties pattern {pattern!r}: {exc}",
                          f"{path}/patternProperties") from None


def _escape_pointer(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")
