"""A tiny regular-expression AST shared by every front end (regex, choice, JSON schema, grammars).

Nodes are immutable tuples so they hash and compare by structure (equal sub-expressions are
compiled once)::

    ("chars", ((lo, hi), ...))     a set of Unicode code points, sorted disjoint ranges
    ("seq", (node, ...))           concatenation; ("seq", ()) is the empty string
    ("alt", (node, ...))           alternation
    ("rep", node, min, max)        repetition, max None = unbounded
    ("rule", name)                 a reference to a grammar rule (never inside a regex terminal)

Code points are matched as their UTF-8 encodings (see ``utf8.py``), so a compiled automaton
reads bytes, which is what tokens are made of.
"""
from __future__ import annotations

from functools import lru_cache

from . import deadline

MAX_CODE_POINT = 0x10FFFF
SURROGATES = (0xD800, 0xDFFF)

EMPTY = ("seq", ())
NOTHING = ("chars", ())


def chars(ranges) -> tuple:
    """A character set from (lo, hi) ranges, normalised (sorted, merged, surrogates removed)."""
    return ("chars", normalize_ranges(ranges))


@lru_cache(maxsize=4096)
def char(c: str) -> tuple:
    return ("chars", ((ord(c), ord(c)),))


@lru_cache(maxsize=65536)
def literal(text: str) -> tuple:
    """The exact string ``text`` (cached: enums and property names are spelled again and
    again while schemas are merged, and one shared node is also deduplicated by identity)."""
    if len(text) == 1:
        return char(text)
    return ("seq", tuple(char(c) for c in text))


def seq(*nodes) -> tuple:
    flat = []
    for node in nodes:
        if node[0] == "seq":
            flat.extend(node[1])
        else:
            flat.append(node)
    if NOTHING in flat:
        return NOTHING
    return flat[0] if len(flat) == 1 else ("seq", tuple(flat))


def alt(*nodes) -> tuple:
    """The alternation of ``nodes`` (nested alternations flattened), duplicates dropped.

    Small parts (literal strings, numbers: at most ``_HASHED_NODES`` nodes) are deduplicated
    through a set (a choice or an enum of n values would cost n^2 comparisons in a list);
    larger ones by identity, then by equality against the list, since hashing a node walks
    its whole sub-DAG (shared sub-nodes again and again) where comparing it stops at the
    first shared one."""
    flat: list = []
    seen: set[int] = set()
    small: set = set()
    for node in nodes:
        parts = node[1] if node[0] == "alt" else (node,)
        for part in parts:
            if id(part) in seen or part == NOTHING:
                continue
            if part[0] == "chars" or is_small(part):   # a character set: one hashable node
                if part in small:
                    continue
                small.add(part)
            elif part in flat:
                continue
            seen.add(id(part))
            flat.append(part)
            if len(flat) & 1023 == 1023:
                deadline.check()
    if not flat:
        return NOTHING
    return flat[0] if len(flat) == 1 else ("alt", tuple(flat))


_HASHED_NODES = 64
# id(node) -> (node, its tree size if at most _HASHED_NODES, else _HASHED_NODES + 1): ``alt``
# asks about the same parts, and about fresh parts built over the same children, over and
# over (a string's content after every prefix of an object's property names). The node is
# kept so that its id is not reused while cached.
_SIZES: dict = {}
_SIZES_MAX = 100_000


def is_small(node) -> bool:
    """True when ``node``'s tree has at most ``_HASHED_NODES`` nodes and can be hashed."""
    if _size_within(node, _HASHED_NODES) > _HASHED_NODES:
        return False
    try:
        hash(node)
    except TypeError:   # a node holding a list: compared, never hashed
        return False
    return True


def _size_within(node, budget: int) -> int:
    """``node``'s tree size if at most ``budget`` (<= _HASHED_NODES), else ``budget + 1``;
    sizes of sub-nodes come from the cache (recursion depth <= budget)."""
    found = _SIZES.get(id(node))
    if found is not None and found[0] is node:
        return found[1] if found[1] <= budget else budget + 1
    size = 1
    for child in children(node):
        # a character set is one node: counted here, not cached (most leaves are ones)
        size += 1 if child[0] == "chars" else _size_within(child, budget - size)
        if size > budget:
            if budget == _HASHED_NODES:     # known to be large, not only past a smaller budget
                _remember(node, budget + 1)
            return budget + 1
    _remember(node, size)
    return size


def _remember(node, size: int) -> None:
    if len(_SIZES) >= _SIZES_MAX:
        _SIZES.clear()
    _SIZES[id(node)] = (node, size)


def rep(node, lo: int, hi: int | None) -> tuple:
    if hi is not None and hi < lo:
        return NOTHING
    if hi == 0:
        return EMPTY
    if lo == 1 and hi == 1:
        return node
    return ("rep", node, lo, hi)


def opt(node) -> tuple:
    return rep(node, 0, 1)


def normalize_ranges(ranges) -> tuple:
    """Sorted, merged ranges with the UTF-16 surrogates cut out (they have no UTF-8 form)."""
    cut = []
    for lo, hi in ranges:
        lo, hi = max(lo, 0), min(hi, MAX_CODE_POINT)
        if lo > hi:
            continue
        if lo < SURROGATES[0] and hi > SURROGATES[1]:
            cut += [(lo, SURROGATES[0] - 1), (SURROGATES[1] + 1, hi)]
        elif SURROGATES[0] <= lo <= SURROGATES[1] and hi > SURROGATES[1]:
            cut.append((SURROGATES[1] + 1, hi))
        elif SURROGATES[0] <= hi <= SURROGATES[1] and lo < SURROGATES[0]:
            cut.append((lo, SURROGATES[0] - 1))
        elif not (SURROGATES[0] <= lo and hi <= SURROGATES[1]):
            cut.append((lo, hi))
    cut.sort()
    merged: list[list[int]] = []
    for lo, hi in cut:
        if merged and lo <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    return tuple((lo, hi) for lo, hi in merged)


def negate_ranges(ranges) -> tuple:
    out, start = [], 0
    for lo, hi in normalize_ranges(ranges):
        if lo > start:
            out.append((start, lo - 1))
        start = hi + 1
    if start <= MAX_CODE_POINT:
        out.append((start, MAX_CODE_POINT))
    return normalize_ranges(out)


def intersect_ranges(a, b) -> tuple:
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if lo <= hi:
            out.append((lo, hi))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return tuple(out)


def children(node) -> tuple:
    """Sub-expressions of ``node`` (for the two composite kinds the builder adds:
    ("and", a, b) = intersection, ("diff", a, b) = a minus b, ("props", members, sep, tail_none, tail_some))."""
    kind = node[0]
    if kind in ("seq", "alt"):
        return node[1]
    if kind == "rep":
        return (node[1],)
    if kind in ("and", "diff"):
        return (node[1], node[2])
    if kind == "props":
        return tuple(member for member, _ in node[1]) + (node[2], node[3], node[4])
    return ()


# The AST is a DAG (a $ref used twice is one shared tuple), so every walk below memoises by
# node identity: walking it as a tree could take exponential time. Tuples hash recursively
# (without caching), so dicts keyed by node *value* are avoided for the same reason.

def has_rules(node, memo: dict | None = None) -> bool:
    """True if ``node`` refers to a grammar rule anywhere inside."""
    if node[0] == "chars":
        return False
    memo = {} if memo is None else memo
    key = id(node)
    found = memo.get(key)
    if found is None:
        # character sets, most of the leaves, answered without a call or a memo entry
        found = node[0] == "rule" or any(c[0] != "chars" and has_rules(c, memo)
                                         for c in children(node))
        memo[key] = found
    return found


def rule_refs(node, has_rules_memo: dict) -> set:
    """Names of the rules ``node`` refers to. Sub-DAGs without any (``has_rules``, through
    ``has_rules_memo``) are not walked, and a shared node is walked once."""
    out: set = set()
    seen: set = set()
    stack = [node]
    while stack:
        node = stack.pop()
        if id(node) in seen or not has_rules(node, has_rules_memo):
            continue
        seen.add(id(node))
        if node[0] == "rule":
            out.add(node[1])
        stack.extend(children(node))
    return out


def tree_size(node, memo: dict | None = None) -> int:
    """Number of nodes if the DAG were unfolded into a tree (what an NFA build copies)."""
    memo = {} if memo is None else memo
    key = id(node)
    size = memo.get(key)
    if size is None:
        if len(memo) & 1023 == 1023:
            deadline.check()
        factor = repeat_factor(node)
        size = 1 + sum((1 if c[0] == "chars" else tree_size(c, memo)) * factor
                       for c in children(node))
        memo[key] = size
    return size


def repeat_factor(node) -> int:
    if node[0] == "rep":
        return max(node[2], 1 if node[3] is None else node[3], 1)
    return 1


def matches_empty(node, memo: dict | None = None) -> bool:
    memo = {} if memo is None else memo
    key = id(node)
    if key in memo:
        return memo[key]
    kind = node[0]
    if kind in ("chars", "multiple"):
        result = False
    elif kind == "seq":
        result = all(matches_empty(child, memo) for child in node[1])
    elif kind == "alt":
        result = any(matches_empty(child, memo) for child in node[1])
    elif kind == "rep":
        result = node[2] == 0 or matches_empty(node[1], memo)
    elif kind == "and":
        result = matches_empty(node[1], memo) and matches_empty(node[2], memo)
    elif kind == "diff":
        result = matches_empty(node[1], memo) and not matches_empty(node[2], memo)
    elif kind == "props":
        result = all(not req or matches_empty(m, memo) for m, req in node[1]) \
            and matches_empty(node[3], memo)
    else:
        raise ValueError(f"matches_empty on a rule reference {node!r}")
    memo[key] = result
    return result


def props_shared_tail(node) -> tuple | None:
    """For ("props", members, sep, tail_none, tail_some) whose ``tail_none`` is ``prefix
    tail_some`` (or that or nothing: the extras after no member, where the first needs no
    separator and the rest are ``tail_some`` itself): (prefix, optional); else None. An
    automaton then reads ``tail_some`` once, entered from both tracks."""
    _, _, _, tail_none, tail_some = node
    optional = tail_none[0] == "alt" and len(tail_none[1]) == 2 and tail_none[1][0] == EMPTY
    body = tail_none[1][1] if optional else tail_none
    if body[0] == "seq" and len(body[1]) > 1 and body[1][-1] is tail_some:
        return seq(*body[1][:-1]), optional
    return None
