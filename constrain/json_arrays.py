"""JSON arrays: ``items``/``prefixItems`` (and draft 7's tuple ``items`` with
``additionalItems``), ``minItems``/``maxItems``, and ``uniqueItems`` where it is bounded.

Policies: ``maxItems`` above ``MAX_ARRAY_ITEMS`` is enforced as ``MAX_ARRAY_ITEMS`` (sound:
longer valid arrays are refused); ``uniqueItems: true`` is enforced for arrays of at most
one item, and for items drawn from enumerated scalars whose arrays of distinct values have at
most ``MAX_UNIQUE_ORDERINGS`` prefixes (6 values with any maxItems, 70 with maxItems 2: every
ordering spelled out); over strings of unbounded length it is left to ``unique_items``;
elsewhere it is refused (``json_schema``). A counted list whose item copies would hold more
than ``MAX_REPEATED_STATES`` automaton states keeps its item one grammar rule (the
count stays exact, read by the Earley parser rather than spelled out in one automaton)."""
from __future__ import annotations

import itertools

from . import deadline
from . import regex_ast as ra
from .automaton import MAX_NFA_STATES, estimated_states
from .errors import SchemaError
from .grammar import KEPT_PREFIX, MAX_INLINED_NODES
from .json_contains import contains_counts
from .json_keywords import ANNOTATIONS, nonneg_int

MAX_ARRAY_ITEMS = 128
SHARED_ITEM_NODES = MAX_INLINED_NODES   # a rule this large stays one in build_grammar
# A list whose copies of its item would take more automaton states than this keeps the item
# a grammar rule (``maxItems: 100`` of objects with long strings: 100 copies of a few
# thousand states in one terminal, against 100 short productions).
MAX_REPEATED_STATES = 20_000
MAX_UNIQUE_ORDERINGS = 5_000   # uniqueItems over a finite domain: its arrays' prefixes (1,956 at 6 values)


class ArraySchemas:
    """``type: array`` for ``_SchemaCompiler``, a mixin: the host provides ``value(schema,
    path, depth)``, ``ws`` (the whitespace node), ``_valid(value, schema)`` and
    ``_literal(value)``, ``rules`` (the grammar rules being built), and ``_tree_sizes`` (an
    empty dict) and ``_sized`` (an empty list) for ``_unfolded_size``."""

    def _array(self, schema: dict, path: str, depth: int) -> tuple:
        lo = nonneg_int(schema, "minItems", path, 0)
        hi = nonneg_int(schema, "maxItems", path, None)
        if hi is not None and hi > MAX_ARRAY_ITEMS and lo <= MAX_ARRAY_ITEMS:
            hi = MAX_ARRAY_ITEMS
        items = schema.get("items", True)
        prefix = schema.get("prefixItems", [])
        if isinstance(items, list):          # draft 7 tuple form
            prefix, items = items, schema.get("additionalItems", True)
        domain = unique_domain(schema) if schema.get("uniqueItems") is True else None
        if domain:   # every ordering of distinct values, spelled out
            return self._distinct_values(domain, schema, path, lo, hi)
        if "_contains_all" in schema:
            return self._contains_every(schema, path, depth, lo, hi)
        if "contains" in schema:
            return self._contains_array(schema, path, depth, lo, hi)
        prefix_nodes = [self.value(p, f"{path}/prefixItems/{i}", depth + 1) for i, p in enumerate(prefix)]
        copies = hi if hi is not None else lo
        rest = self._shared(self.value(items, f"{path}/items", depth + 1), f"{path}/items", copies)
        body = _list_body(prefix_nodes, rest, lo, hi, self._separator())
        return ra.seq(ra.char("["), self.ws, body, self.ws, ra.char("]"))

    def _separator(self) -> tuple:
        return ra.seq(self.ws, ra.char(","), self.ws)

    def _list_of(self, element: tuple, lo: int, hi: int | None) -> tuple:
        """The elements of a list (no brackets): lo..hi of ``element`` between separators."""
        return _list_body([], element, lo, hi, self._separator())

    def _shared(self, node: tuple, path: str, copies: int = 0) -> tuple:
        """``node``, or a grammar rule standing for it when it is large: a list spells its item
        twice, so items of arrays nested hundreds deep would unfold exponentially; and a list
        of up to ``copies`` items spells it that many times: where the copies would hold too
        many automaton states, the rule is one ``build_grammar`` never inlines."""
        if copies > 1 and estimated_states(node) * copies > MAX_REPEATED_STATES:
            name = f"{KEPT_PREFIX}{path}"
            self.rules[name] = node
            return ("rule", name)
        if self._unfolded_size(node) <= SHARED_ITEM_NODES:
            return node
        name = f"$items:{path}"
        self.rules[name] = node
        return ("rule", name)

    def _unfolded_size(self, node: tuple) -> int:
        """``ra.tree_size(node)``, memoised for the whole document: the item of a list holds
        the lists nested in it, whose items were sized already. The memo keeps every node
        asked about, so that the ids of their sub-nodes are not reused while it lives."""
        self._sized.append(node)
        return ra.tree_size(node, self._tree_sizes)

    def _distinct_values(self, domain: list, schema: dict, path: str, lo: int, hi: int | None) -> tuple:
        """``uniqueItems`` over a small domain: arrays of lo..hi distinct values, spelled out as
        the tree of their orderings (each prefix once)."""
        values = [v for v in domain if self._valid(v, schema["items"])]
        top = len(values) if hi is None else min(hi, len(values))
        literals = [self._literal(v) for v in values]
        sep = self._separator()
        counted = self._contained_count(values, schema)

        def following(chosen: tuple) -> tuple:
            deadline.check()
            done = len(chosen) >= lo and counted([values[i] for i in chosen])
            more = [] if len(chosen) == top else [
                ra.seq(sep if chosen else ra.EMPTY, literals[i], following(chosen + (i,)))
                for i in range(len(values)) if i not in chosen]
            return ra.alt(ra.EMPTY if done else ra.NOTHING, *more)

        node = ra.seq(ra.char("["), self.ws, following(()), self.ws, ra.char("]"))
        if ra.tree_size(node) > MAX_NFA_STATES:
            raise SchemaError(f"JSON-schema keyword 'uniqueItems' over {len(values)} values "
                              "spells out more orderings than an automaton may hold; lower "
                              "maxItems or the number of values", f"{path}/uniqueItems")
        return node

    def _contained_count(self, values: list, schema: dict):
        """A test of a chosen array of ``values`` against ``contains`` and its counts."""
        if "contains" not in schema:
            return lambda chosen: True
        least, most = contains_counts(schema, "#")
        matching = {id(v) for v in values if self._valid(v, schema["contains"])}   # 1 and True differ

        def meets(chosen) -> bool:
            count = sum(1 for v in chosen if id(v) in matching)
            return count >= least and (most is None or count <= most)
        return meets


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


def unique_domain(schema: dict) -> list | None:
    """What makes ``uniqueItems`` enforceable for this array schema: [] when at most one item
    fits (nothing to enforce), the item values when the items are a finite set of scalars with
    at most ``MAX_UNIQUE_ORDERINGS`` orderings, else None."""
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
    if orderings(len(distinct), schema.get("maxItems")) > MAX_UNIQUE_ORDERINGS:
        return None
    return [v for _, v in distinct] or None


def orderings(count: int, max_items) -> int:
    """Non-empty arrays of distinct values drawn from ``count`` (at most ``max_items`` long):
    the prefixes ``_distinct_values`` spells out."""
    top = count if not isinstance(max_items, int) else min(count, max_items)
    total, arrangements = 0, 1
    for size in range(1, top + 1):
        arrangements *= count - size + 1
        total += arrangements
    return total
