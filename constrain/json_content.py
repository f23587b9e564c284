"""Content identity of JSON-schema values: equal content, equal small int.

The schema compiler builds equal subschemas afresh (a merged allOf, a ``$ref`` with
siblings, a oneOf branch intersected with the others' negations) and compiles each one in
full; keyed by content, each is compiled once. Serialising every subschema to text for the
key is quadratic in the nesting (a subschema is re-read at every level above it), so ids are
built bottom-up and memoised per object. That needs what the compiler does anyway: a dict
or list is never changed once built (merges and rewrites copy first), and every object
memoised is kept alive, so its ``id()`` is not reused for another object.
"""
from __future__ import annotations


class ContentIds:
    """``of(value) -> int``: equal JSON content, equal id (key order counts: a properties
    map's order is the order the properties are written in). 1, 1.0 and True differ."""

    def __init__(self):
        self._ids: dict[tuple, int] = {}
        self._memo: dict[int, tuple[int, object]] = {}     # id(object) -> (content, object)
        self._alive: list = []                              # objects keyed by their id()

    def of(self, value) -> int:
        if not isinstance(value, (dict, list, tuple)):
            try:
                return self._intern((type(value).__name__, value))
            except TypeError:                   # unhashable and not JSON: itself only
                return self._intern(("object", id(self._keep(value))))
        known = self._memo.get(id(value))
        if known is not None:
            return known[0]
        if isinstance(value, dict):
            parts = ("{",) + tuple((k, self.of(v)) for k, v in value.items())
        else:
            parts = ("[" if isinstance(value, list) else "(",) + tuple(self.of(v) for v in value)
        content = self._intern(parts)
        self._memo[id(value)] = (content, value)
        return content

    def _keep(self, value):
        self._alive.append(value)
        return value

    def _intern(self, parts: tuple) -> int:
        return self._ids.setdefault(parts, len(self._ids))
