"""Which subschemas of a document may apply at a place in an instance, read while generating.

``uniqueItems`` over strings of unbounded length cannot be spelled out in an automaton
(``json_arrays`` spells out only finite domains); ``unique_items`` enforces it beside the
automaton and needs to know, at each array the output opens, whether a schema that may apply
there asks for unique items. ``SchemaPositions`` answers from the document itself:

    root()                     the subschemas that apply to the whole instance
    member(place, name)        ... to the value of property ``name`` of an object at ``place``
    item(place, index)         ... to item ``index`` of an array at ``place``
    wants_unique(place)        some subschema at ``place`` has ``uniqueItems: true``

A place is a frozenset of subschema ids, closed under ``$ref``, ``allOf``, ``anyOf``,
``oneOf``, ``then``/``else`` and ``dependentSchemas``: every branch that *may* apply
is in it (an over-approximation: uniqueness is enforced wherever some branch asks for it, so
never missed; a valid output whose branch does not ask for it may be refused).
"""
from __future__ import annotations

import re

from .json_refs import SchemaReferences

BRANCH_LISTS = ("allOf", "anyOf", "oneOf")
BRANCH_SCHEMAS = ("then", "else")       # "if" only tests; "not" asks the opposite


class _References(SchemaReferences):
    """The document's $ref resolution, without a compiler around it."""

    def __init__(self, root):
        self.root = root
        self._index_document()


class SchemaPositions:
    def __init__(self, document):
        self._refs = _References(document)
        self._schemas: dict[int, dict] = {}
        self._places: dict[tuple, frozenset] = {}
        self._unique: dict[frozenset, bool] = {}
        self._root = self._closure([document])

    def root(self) -> frozenset:
        return self._root

    def member(self, place: frozenset, name: str) -> frozenset:
        return self._below(place, ("member", name), lambda schema: _member_schemas(schema, name))

    def item(self, place: frozenset, index: int) -> frozenset:
        return self._below(place, ("item", index), lambda schema: _item_schemas(schema, index))

    def _below(self, place: frozenset, step: tuple, subschemas) -> frozenset:
        """The place one ``step`` below ``place`` (computed once)."""
        key = (place, step)
        if key not in self._places:
            self._places[key] = self._closure(
                sub for schema in self._each(place) for sub in subschemas(schema))
        return self._places[key]

    def wants_unique(self, place: frozenset) -> bool:
        if place not in self._unique:
            self._unique[place] = any(s.get("uniqueItems") is True for s in self._each(place))
        return self._unique[place]

    def _each(self, place: frozenset):
        return (self._schemas[i] for i in place)

    def _closure(self, schemas) -> frozenset:
        found: set[int] = set()
        stack = list(schemas)
        while stack:
            schema = stack.pop()
            if not isinstance(schema, dict) or id(schema) in found:
                continue
            found.add(id(schema))
            self._schemas[id(schema)] = schema
            if isinstance(schema.get("$ref"), str):
                stack.append(self._refs._resolve(schema["$ref"], schema, "#")[0])
            for keyword in BRANCH_LISTS:
                if isinstance(schema.get(keyword), list):
                    stack.extend(schema[keyword])
            stack.extend(schema.get(keyword) for keyword in BRANCH_SCHEMAS)
            for keyword in ("dependentSchemas", "dependencies"):
                if isinstance(schema.get(keyword), dict):
                    stack.extend(schema[keyword].values())
        return frozenset(found)


def _member_schemas(schema: dict, name: str) -> list:
    """The subschemas of ``schema`` that may apply to its property ``name``: the declared
    one, else ``additionalProperties`` (kept beside a matching pattern too: Python's reading
    of an ECMA pattern may differ), and the patterns that may match."""
    properties = schema.get("properties")
    if isinstance(properties, dict) and name in properties:
        out = [properties[name]]
    else:
        out = [schema.get("additionalProperties")]
    patterns = schema.get("patternProperties")
    if isinstance(patterns, dict):
        out += [sub for pattern, sub in patterns.items() if _may_match(pattern, name)]
    return out


def _item_schemas(schema: dict, index: int) -> list:
    """The subschemas of ``schema`` that apply to its item ``index`` (``contains`` too: it
    may apply to any item)."""
    prefix = schema.get("prefixItems")
    items = schema.get("items")
    if isinstance(items, list):                  # draft 7's tuple form
        prefix, items = items, schema.get("additionalItems")
    out = [schema.get("contains")]
    if isinstance(prefix, list) and index < len(prefix):
        out.append(prefix[index])
    else:
        out.append(items)
    return out


def _may_match(pattern: str, name: str) -> bool:
    """Whether the ECMA ``pattern`` may match ``name``: Python's reading of it, or True where
    Python cannot read it (the place then holds the pattern's schema, which is sound)."""
    try:
        return re.search(pattern, name) is not None
    except (re.error, TypeError):
        return True
