"""JSON arrays with ``contains`` (``minContains``/``maxContains``, default 1 and unbounded):
every element is either *matching* (it meets the items schema and ``contains``) or *missing*
(it meets the items schema and ``not contains``), and the matching ones are counted::

    body  = missing (, missing)* (, matching (, missing)*){min..max}
          | matching (, missing)* (, matching (, missing)*){min-1..max-1}
          | (empty, when min is 0)

Sound: a missing element meets the negation of ``contains`` (``json_combinators._not``:
exact, or an under-approximation), so an output holds exactly as many elements meeting
``contains`` as it counts. Valid arrays whose other elements the negation cannot describe
may be refused. ``minItems``/``maxItems`` beyond what the count implies are the intersection
with the plain list; where the elements hold grammar rules (recursive or free-form values),
which an intersection cannot, both counts are states of one list (``_CountingList``: at most
``MAX_COUNTING_STATES``). ``prefixItems`` (tuple items) beside ``contains`` is refused: a
``SchemaError`` naming ``contains``. Two ``contains`` of one allOf (``_contains_all``, each
wanting one match) ask for an element meeting each (``_contains_every``)."""
from __future__ import annotations

import itertools

from . import regex_ast as ra
from .errors import SchemaError
from .json_keywords import nonneg_int
from .json_witnesses import partitions

MAX_COUNTING_STATES = 4_096
MAX_CONTAINS_ORDERS = 64


class ContainsSchemas:
    """``contains`` for ``_SchemaCompiler``, a mixin: the host provides ``value(schema, path,
    depth)``, ``ws`` (the whitespace node), ``_separator()`` and ``_list_of(element, lo, hi)``
    (the plain list body with lo..hi elements)."""

    def _contains_array(self, schema: dict, path: str, depth: int, lo: int, hi: int | None) -> tuple:
        where = f"{path}/contains"
        least, most = contains_counts(schema, path)
        if "prefixItems" in schema or isinstance(schema.get("items"), list):
            raise SchemaError("'contains' is enforced only where every item has one schema "
                              "(not beside prefixItems or tuple items)", where)
        items, wanted = schema.get("items", True), schema["contains"]
        matching = self.value({"allOf": [items, wanted]}, where, depth + 1)
        missing = self.value({"allOf": [items, {"not": wanted}]}, where, depth + 1)
        if lo <= least and hi is None:
            body = self._counted(matching, missing, least, most)
        elif not ra.has_rules(ra.alt(matching, missing)):
            body = ("and", self._counted(matching, missing, least, most),
                    self._list_of(ra.alt(matching, missing), lo, hi))
        else:   # an intersection cannot hold grammar rules: count both in one automaton
            body = _CountingList(matching, missing, self._separator(), (least, most), (lo, hi),
                                 where).body()
        return ra.seq(ra.char("["), self.ws, body, self.ws, ra.char("]"))

    def _contains_every(self, schema: dict, path: str, depth: int, lo: int, hi: int | None) -> tuple:
        """``_contains_all`` (two ``contains`` of one allOf, json_merge): an element meeting
        each schema, one element possibly meeting several. Exact: every grouping of the
        schemas into witness elements, in every order, other elements anywhere around them;
        ``minItems``/``maxItems`` are the intersection with the plain list (refused where the
        elements hold grammar rules)."""
        where = f"{path}/contains"
        if "prefixItems" in schema or isinstance(schema.get("items"), list):
            raise SchemaError("'contains' is enforced only where every item has one schema "
                              "(not beside prefixItems or tuple items)", where)
        items, wanted = schema.get("items", True), list(schema["_contains_all"])
        free = self.value(items, f"{path}/items", depth + 1)
        sep = self._separator()
        bodies = []
        for groups in partitions(wanted):
            witnesses = [self.value({"allOf": [items] + group}, where, depth + 1) for group in groups]
            if any(w == ra.NOTHING for w in witnesses):
                continue
            for order in itertools.permutations(witnesses):
                bodies.append(_around(list(order), free, sep))
                if len(bodies) > MAX_CONTAINS_ORDERS:
                    raise SchemaError("too many 'contains' in one allOf", where)
        body = ra.alt(*bodies)
        if lo > 1 or hi is not None:        # one witness element may meet every schema
            if ra.has_rules(ra.alt(body, free)):
                raise SchemaError("minItems/maxItems beside several 'contains' of recursive or "
                                  "free-form items is not supported", where)
            body = ("and", body, self._list_of(free, lo, hi))
        return ra.seq(ra.char("["), self.ws, body, self.ws, ra.char("]"))

    def _counted(self, matching: tuple, missing: tuple, least: int, most: int | None) -> tuple:
        """Lists of elements, between ``least`` and ``most`` of them ``matching``, the others
        ``missing`` (see the module's picture)."""
        sep = ra.seq(self.ws, ra.char(","), self.ws)
        missing_run = ra.rep(ra.seq(sep, missing), 0, None)
        counted_run = ra.seq(sep, matching, missing_run)
        arms = [ra.seq(missing, missing_run, ra.rep(counted_run, least, most))]
        if most is None or most >= 1:
            arms.append(ra.seq(matching, missing_run, ra.rep(
                counted_run, max(least - 1, 0), None if most is None else most - 1)))
        if least == 0:
            arms.append(ra.EMPTY)
        return ra.alt(*arms)


class _CountingList:
    """A list body counting its elements (``lo..hi``) and its matching ones (``least..most``)
    as the state of each position: (elements so far, matching so far), each capped where
    counting further changes nothing. Nodes are shared between states (a DAG), which grammar
    rules keep shared; states that loop on themselves (past both lower bounds, no upper one)
    are a repetition."""

    def __init__(self, matching, missing, sep, counts: tuple, lengths: tuple, where: str):
        self.matching, self.missing, self.sep = matching, missing, sep
        (self.least, self.most), (self.lo, self.hi) = counts, lengths
        self.length_cap = self.hi if self.hi is not None else max(self.lo, 1)
        self.count_cap = self.most if self.most is not None else self.least
        if (self.length_cap + 1) * (self.count_cap + 1) > MAX_COUNTING_STATES:
            raise SchemaError("'contains' with these minItems/maxItems/minContains/maxContains "
                              "counts too many states for recursive or free-form items", where)
        self.memo: dict = {}

    def body(self) -> tuple:
        return self.state(0, 0)

    def state(self, length: int, count: int) -> tuple:
        key = (length, count)
        if key not in self.memo:
            self.memo[key] = self._build(length, count)
        return self.memo[key]

    def _build(self, length: int, count: int) -> tuple:
        lead = self.sep if length else ra.EMPTY
        length_next = min(length + 1, self.length_cap) if self.hi is None else length + 1
        done = ra.EMPTY if length >= self.lo and count >= self.least else ra.NOTHING
        if self.hi is not None and length == self.hi:
            return done
        count_next = count + 1 if self.most is not None else min(count + 1, self.count_cap)
        loops_on_missing = length_next == length
        loops_on_matching = loops_on_missing and count_next == count
        if loops_on_matching:     # past lo and least, nothing bounded: any element, any number
            element = ra.seq(self.sep, ra.alt(self.matching, self.missing))
            return ra.rep(element, 0, None)
        more = []
        if self.most is None or count < self.most:
            more.append(ra.seq(lead, self.matching, self.state(length_next, count_next)))
        if loops_on_missing:      # past lo (so past the first element): missing ones repeat
            return ra.seq(ra.rep(ra.seq(self.sep, self.missing), 0, None), ra.alt(done, *more))
        more.append(ra.seq(lead, self.missing, self.state(length_next, count)))
        return ra.alt(done, *more)


def _around(witnesses: list, free, sep) -> tuple:
    """A list holding ``witnesses`` in this order, any number of ``free`` elements around."""
    run = ra.rep(ra.seq(sep, free), 0, None)
    later = [part for w in witnesses[1:] for part in (ra.seq(sep, w), run)]
    first_is_witness = ra.seq(witnesses[0], run, *later)
    return ra.alt(first_is_witness, ra.seq(free, run, ra.seq(sep, witnesses[0]), run, *later))


def contains_counts(schema: dict, path: str) -> tuple[int, int | None]:
    """(minContains, maxContains) of an array schema with ``contains``: (1, None) by default."""
    return (nonneg_int(schema, "minContains", path, 1),
            nonneg_int(schema, "maxContains", path, None))
