"""Anchors inside a pattern (``^([^,]|$)``, ``(a|^b)c``): the parser leaves ``BOS``/``EOS``
markers (zero-width nodes) where ``^``/``$`` stand, and ``drop_anchors`` rewrites the whole
pattern into a marker-free node with the same language.

``^`` matches only where nothing has been consumed yet, ``$`` only where nothing will be
consumed after (ECMAScript without the multiline flag, the JSON-schema dialect). Each marker
kind goes in one pass over the AST; a node is split into its zero-width paths (``zero``: a
node of markers of the other kind, or EMPTY, or NOTHING) and its consuming paths (``more``),
each under a mode: ``edge`` (nothing consumed yet before it, for ``^``; nothing consumed after
it, for ``$``) or not. A sequence is read from the side of the anchor: for ``^`` the first
consuming element moves the rest out of the edge mode; for ``$`` the last one does, reading
right to left. Results are memoised by node identity and mode (the AST is a DAG).
"""
from __future__ import annotations

from . import regex_ast as ra

BOS = ("bos",)
EOS = ("eos",)


def has_anchor(node, memo: dict | None = None) -> bool:
    memo = {} if memo is None else memo
    found = memo.get(id(node))
    if found is None:
        found = node[0] in ("bos", "eos") or any(has_anchor(c, memo) for c in ra.children(node))
        memo[id(node)] = found
    return found


def drop_anchors(node) -> tuple:
    """``node`` (matched against the whole string) without BOS/EOS markers, same language."""
    if not has_anchor(node):
        return node
    node = _Pass(BOS, from_right=False).whole(node)
    return _Pass(EOS, from_right=True).whole(node)


class _Pass:
    """Removes one marker kind: ``whole(node)`` is node's language with the marker met only
    at its edge of the string."""

    def __init__(self, marker: tuple, from_right: bool):
        self.marker, self.from_right = marker, from_right
        self.memo: dict = {}

    def whole(self, node) -> tuple:
        return self.full(node, True)

    def full(self, node, edge: bool) -> tuple:
        return ra.alt(self.zero(node, edge), self.more(node, edge))

    def zero(self, node, edge: bool) -> tuple:
        """The zero-width paths of ``node`` (markers of the other kind kept)."""
        return self._cached("zero", node, edge)

    def more(self, node, edge: bool) -> tuple:
        """The paths of ``node`` that consume at least one character."""
        return self._cached("more", node, edge)

    def _cached(self, part: str, node, edge: bool) -> tuple:
        key = (part, id(node), edge)
        found = self.memo.get(key)
        if found is None:
            found = (self._zero if part == "zero" else self._more)(node, edge)
            self.memo[key] = (found, node)    # the node kept so that its id stays unique
            return found
        return found[0]

    def _zero(self, node, edge: bool) -> tuple:
        kind = node[0]
        if node == self.marker:
            return ra.EMPTY if edge else ra.NOTHING
        if kind in ("bos", "eos"):
            return node
        if kind == "chars":
            return ra.NOTHING
        if kind == "alt":
            return ra.alt(*(self.zero(c, edge) for c in node[1]))
        if kind == "seq":
            return ra.seq(*(self.zero(c, edge) for c in node[1]))
        if kind == "rep":
            _, inner, lo, hi = node
            if hi == 0 or lo == 0:
                return ra.alt(ra.EMPTY, self.zero(inner, edge)) if hi != 0 else ra.EMPTY
            return self.zero(inner, edge)     # markers repeated mean the same as once
        raise ValueError(f"anchors inside a {kind!r} node")

    def _more(self, node, edge: bool) -> tuple:
        kind = node[0]
        if kind in ("bos", "eos"):
            return ra.NOTHING
        if kind == "chars":
            return node
        if kind == "alt":
            return ra.alt(*(self.more(c, edge) for c in node[1]))
        if kind == "seq":
            items = list(node[1][::-1] if self.from_right else node[1])
            return self._more_seq(items, edge)
        if kind == "rep":
            return self._more_rep(node, edge)
        raise ValueError(f"anchors inside a {kind!r} node")

    def _ordered(self, first, rest) -> tuple:
        """seq(first, rest) in string order (``first`` is nearer the anchor's edge)."""
        return ra.seq(rest, first) if self.from_right else ra.seq(first, rest)

    def _more_seq(self, items: list, edge: bool) -> tuple:
        """Consuming paths of the sequence ``items`` (listed from the anchor's side)."""
        if not items:
            return ra.NOTHING
        head, tail = items[0], items[1:]
        rest_seq = ("seq", tuple(tail[::-1] if self.from_right else tail)) if tail else ra.EMPTY
        consuming_head = self._ordered(self.more(head, edge), self.full(rest_seq, False))
        silent_head = self._ordered(self.zero(head, edge), self._more_seq(tail, edge))
        return ra.alt(consuming_head, silent_head)

    def _more_rep(self, node, edge: bool) -> tuple:
        """Consuming paths of a repetition: maybe zero-width iterations, one consuming
        iteration under ``edge``, then the others away from the edge."""
        _, inner, lo, hi = node
        if hi == 0:
            return ra.NOTHING
        first = self.more(inner, edge)
        away = self.full(inner, False)
        after_first = ra.rep(away, max(lo - 1, 0), None if hi is None else hi - 1)
        out = [self._ordered(first, after_first)]
        silent = self.zero(inner, edge)
        if silent != ra.NOTHING and (hi is None or hi >= 2):
            # k >= 1 zero-width iterations first: the counts left are the union over k
            after = ra.rep(away, 0, None if hi is None else hi - 2)
            out.append(self._ordered(silent, self._ordered(first, after)))
        return ra.alt(*out)
