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
with the plain list; with grammar rules in the elements (recursive or free-form values) that
intersection cannot be built and is refused, as are ``prefixItems`` (tuple items) beside
``contains``: a ``SchemaError`` naming ``contains``."""
from __future__ import annotations

from . import regex_ast as ra
from .errors import SchemaError
from .json_keywords import nonneg_int


class ContainsSchemas:
    """``contains`` for ``_SchemaCompiler``, a mixin: the host provides ``value(schema, path,
    depth)``, ``ws`` (the whitespace node) and ``_list_of(element, lo, hi)`` (the plain list
    body with lo..hi elements)."""

    def _contains_array(self, schema: dict, path: str, depth: int, lo: int, hi: int | None) -> tuple:
        where = f"{path}/contains"
        least, most = contains_counts(schema, path)
        if "prefixItems" in schema or isinstance(schema.get("items"), list):
            raise SchemaError("'contains' is enforced only where every item has one schema "
                              "(not beside prefixItems or tuple items)", where)
        items, wanted = schema.get("items", True), schema["contains"]
        matching = self.value({"allOf": [items, wanted]}, where, depth + 1)
        missing = self.value({"allOf": [items, {"not": wanted}]}, where, depth + 1)
        body = self._counted(matching, missing, least, most)
        if lo > least or hi is not None:
            elements = ra.alt(matching, missing)
            if ra.has_rules(elements):
                raise SchemaError("'contains' with minItems/maxItems is enforced only for items "
                                  "without recursive or free-form values", where)
            body = ("and", body, self._list_of(elements, lo, hi))
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


def contains_counts(schema: dict, path: str) -> tuple[int, int | None]:
    """(minContains, maxContains) of an array schema with ``contains``: (1, None) by default."""
    return (nonneg_int(schema, "minContains", path, 1),
            nonneg_int(schema, "maxContains", path, None))
