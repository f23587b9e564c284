"""Members an object must contain: the internal keyword ``_some``, a list of requirements
``{"name": string schema, "value": schema}``, each met by at least one member whose name
meets ``name`` and whose value meets ``value``. ``json_conditionals.negate`` writes them for
``not`` around ``patternProperties`` (a key matching the pattern whose value fails its
schema) and ``propertyNames`` (a key failing it).

Every way to meet the requirements is one alternative: each requirement is met by a declared
member whose name meets it (made required, its value narrowed) or by an extra member; extra
witnesses meeting several requirements at once are one member (every grouping is tried).
The union is exact when the object has no ``maxProperties`` (extras in any order around the
witnesses); with it, witnesses come first among the extras, then the free extras (sound, may
refuse valid orders). Alternatives past ``MAX_WITNESS_CHOICES`` are left out (sound).
``json_conditionals`` also writes one for an object unequal to a ``const``: a key besides
the constant's keys."""
from __future__ import annotations

import itertools

from . import regex_ast as ra
from .errors import SchemaError

MAX_WITNESS_CHOICES = 64


class Witnesses:
    """``_some`` for ``json_objects.ObjectSchemas``, a mixin: the host provides
    ``value(schema, path, depth)``, ``_valid(value, schema, formats)``, ``_member(name,
    value_node)`` and ``ws``."""

    def _bodies_with_some(self, requirements: list, members: list, declared: list, kinds: list,
                          layout: tuple, path: str, depth: int) -> list:
        """Object bodies (between the braces) meeting every requirement. ``members``: (node,
        required) of the declared members; ``declared``: their (name, schema, pointer);
        ``kinds``: (key node, (schema, pointer), value node) of the extras;
        ``layout``: (separator, extra member node, minProperties, maxProperties, ``plain``:
        the body of given members without witnesses)."""
        _check_requirements(requirements, path)
        options = [[i for i, (name, _, _) in enumerate(declared)
                    if self._valid(name, req["name"], formats=True)] + [None] for req in requirements]
        bodies = []
        for choice in itertools.product(*options):
            narrowed = self._narrowed_members(requirements, choice, members, declared, depth)
            if narrowed is None:
                continue
            extra_reqs = [req for req, c in zip(requirements, choice) if c is None]
            for groups in partitions(extra_reqs):
                bodies += self._bodies_for(groups, narrowed, kinds, layout, path, depth)
                if len(bodies) >= MAX_WITNESS_CHOICES:
                    return bodies[:MAX_WITNESS_CHOICES]     # the others left out: sound
        return bodies

    def _narrowed_members(self, requirements, choice, members, declared, depth) -> list | None:
        """``members`` with each declared witness required and its value meeting its
        requirements; None if one cannot."""
        out = list(members)
        for i in {c for c in choice if c is not None}:
            wanted = [req["value"] for req, c in zip(requirements, choice) if c == i]
            name, schema, where = declared[i]
            value = self.value({"allOf": [schema] + wanted}, where, depth + 1)
            if value == ra.NOTHING:
                return None
            out[i] = (self._member(name, value), True)
        return out

    def _bodies_for(self, groups: list, members: list, kinds: list, layout: tuple,
                    path: str, depth: int) -> list:
        sep, extra, lo, hi, plain = layout
        if not groups:
            return [plain(tuple(members))]
        extra_hi = None if hi is None else hi - len(members)
        if extra_hi is not None and extra_hi < len(groups):
            return []
        witnesses = [self._witness(group, kinds, path, depth) for group in groups]
        if any(w == ra.NOTHING for w in witnesses):
            return []
        if lo > sum(1 for _, req in members if req) + len(witnesses) and lo > 1:
            raise SchemaError("minProperties above 1 next to a negated patternProperties or "
                              "propertyNames is not supported", f"{path}/minProperties")
        orders = itertools.permutations(witnesses) if extra_hi is None else [witnesses]
        return [_body(members, sep, extra, list(order), extra_hi) for order in orders]

    def _witness(self, group: list, kinds: list, path: str, depth: int) -> tuple:
        """One extra member meeting every requirement of ``group``."""
        names = [self.value({"allOf": [req["name"], {"type": "string"}]}, path, depth + 1)
                 for req in group]
        if any(ra.has_rules(name) for name in names):
            raise SchemaError("a negated propertyNames must be a string schema", path)
        alternatives = []
        for key, (schema, where), _ in kinds:
            for name in names:
                key = ("and", key, name)
            value = self.value({"allOf": [schema] + [req["value"] for req in group]}, where, depth + 1)
            if value != ra.NOTHING:
                alternatives.append(ra.seq(key, self.ws, ra.char(":"), self.ws, value))
        return ra.alt(*alternatives)


def _check_requirements(requirements, path: str) -> None:
    if not isinstance(requirements, list) or not all(
            isinstance(req, dict) and req.keys() == {"name", "value"} for req in requirements):
        raise SchemaError("_some must be a list of {name, value} requirements", path)


def _body(members: list, sep, extra, witnesses: list, extra_hi) -> tuple:
    """Declared ``members`` then extras holding ``witnesses`` (in this order): free extras
    anywhere among them without a bound, else at most ``extra_hi`` members after them."""
    if extra_hi is None:
        free = ra.rep(ra.seq(sep, extra), 0, None)
        later = [part for w in witnesses[1:] for part in (ra.seq(sep, w), free)]
        tail_some = ra.seq(free, ra.seq(sep, witnesses[0]), free, *later)
        tail_none = ra.alt(ra.seq(extra, tail_some), ra.seq(witnesses[0], free, *later))
    else:
        free = ra.rep(ra.seq(sep, extra), 0, extra_hi - len(witnesses))
        later = [ra.seq(sep, w) for w in witnesses[1:]]
        tail_some = ra.seq(ra.seq(sep, witnesses[0]), *later, free)
        tail_none = ra.seq(witnesses[0], *later, free)
    return ("props", tuple(members), sep, tail_none, tail_some) if members else tail_none


def partitions(items: list):
    """Every way to split ``items`` into non-empty groups ([[]] for none: no extra witness)."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for groups in partitions(rest):
        yield [[first]] + groups
        for i in range(len(groups)):
            yield groups[:i] + [[first] + groups[i]] + groups[i + 1:]
