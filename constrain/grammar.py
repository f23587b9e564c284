"""Grammar rules (regex ASTs that may reference each other) -> terminals + Earley grammar.

``build_grammar(rules, root, ignore=())`` returns either a regex AST (the grammar turned out
regular after inlining) or a ``GrammarSpec``:

1. rules that are not recursive are inlined where they are used, so regular structure
   (strings, numbers, keywords with their whitespace) ends up inside few, large terminals
   (a body past ``MAX_INLINED_NODES`` nodes stays a rule: inlining may copy it many times);
2. inside each remaining rule, every maximal sub-expression without rule references
   becomes one terminal (a regex, compiled to a lazy DFA); the rest becomes BNF productions;
3. terminals that match the empty string become optional symbols over their non-empty
   part (a lexeme always has at least one byte).

Tokens are then lexed nondeterministically (every split into terminals is tried), so the
accepted language is exactly the grammar's.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from . import deadline, native
from . import regex_ast as ra
from .earley import EarleyGrammar, derivable
from .errors import GrammarError


@dataclass
class GrammarSpec:
    terminals: list                      # regex AST per terminal id
    earley: EarleyGrammar
    ignore: tuple = ()                   # terminal ids that may appear between any two lexemes
    names: dict = field(default_factory=dict)


def build_grammar(rules: dict, root: str, ignore=()) -> tuple | GrammarSpec:
    if root not in rules:
        raise GrammarError(f"the grammar has no start rule {root!r}")
    with_rules: dict = {}        # has_rules memo shared by every step (the rules keep ids alive)
    refs = {name: ra.rule_refs(node, with_rules) for name, node in rules.items()}
    for name, names in refs.items():
        for ref in names:
            if ref not in rules:
                raise GrammarError(f"rule {name!r} refers to undefined rule {ref!r}")
    kept = _recursive_rules(refs) | {name for name in rules if name.startswith(KEPT_PREFIX)}
    inliner = _Inliner(rules, kept, with_rules)
    bodies: dict = {}
    pending = [name for name in rules if name in kept or name == root]
    while pending:               # inlining may keep a large rule: it gets a body too
        name = pending.pop()
        if name not in bodies:
            bodies[name] = inliner.inline(rules[name])
            pending.extend(kept - bodies.keys())
    if not ra.has_rules(bodies[root], with_rules) and not ignore:
        return bodies[root]
    spec = _Builder(bodies, root, ignore, with_rules).build()
    core = native.CORE
    if core is not None:        # kept with the grammar: see automaton.build_nfa
        for terminal in spec.terminals:
            core.untrack_ast(terminal)
    return spec


def _recursive_rules(refs: dict) -> set:
    """Names of the rules that reach themselves; ``refs`` maps every rule to the names its
    body refers to."""
    recursive = set()
    for name in refs:
        seen, stack = set(), list(refs[name])
        while stack:
            ref = stack.pop()
            if ref == name:
                recursive.add(name)
                break
            if ref not in seen:
                seen.add(ref)
                stack.extend(refs[ref])
    return recursive


# A non-recursive rule whose inlined body would unfold past this many nodes stays a
# nonterminal (the JSON items of arrays nested hundreds deep: inlining copies them twice a level).
MAX_INLINED_NODES = 50_000
# Rules named with this prefix stay nonterminals, never inlined (``json_arrays`` names so
# the item of a counted list whose copies would take too many automaton states).
KEPT_PREFIX = "$kept:"


class _Inliner:
    """Step 1: nodes with references to non-recursive rules replaced by their bodies, except
    bodies larger than ``MAX_INLINED_NODES``: their names join ``recursive`` (kept as
    nonterminals). A sub-DAG without references is its own result, shared, never copied."""

    def __init__(self, rules: dict, recursive: set, with_rules: dict):
        self.rules = rules
        self.recursive = recursive
        self.with_rules = with_rules       # ra.has_rules memo
        self.memo: dict = {}     # id(node) -> (node, result), ("rule", name) -> body: a DAG
        self.sizes: dict = {}    # ra.tree_size memo over the bodies (kept alive by memo)
        self.expanded: list = []   # props nodes spelled as rules: alive while ids are memoised

    def inline(self, node) -> tuple:
        if not ra.has_rules(node, self.with_rules):
            return node
        found = self.memo.get(id(node))
        if found is None:
            found = (node, self._inline_uncached(node))
            self.memo[id(node)] = found
        return found[1]

    def _inline_uncached(self, node) -> tuple:
        kind = node[0]
        if kind == "rule":
            return self._reference(node)
        if kind in ("seq", "alt"):
            parts = [self.inline(child) for child in node[1]]
            return ra.seq(*parts) if kind == "seq" else ra.alt(*parts)
        if kind == "rep":
            return ra.rep(self.inline(node[1]), node[2], node[3])
        if kind == "props":
            self.expanded.append(_props_as_rules(node, self.rules, self.recursive))
            return self.inline(self.expanded[-1])
        raise GrammarError("an intersection or difference cannot contain grammar rules")

    def _reference(self, node) -> tuple:
        """The body of the rule ``node`` names, or ``node`` itself if that rule is kept."""
        name = node[1]
        if name not in self.recursive and ("rule", name) not in self.memo:
            body = self.inline(self.rules[name])
            if ra.tree_size(body, self.sizes) > MAX_INLINED_NODES:
                self.recursive.add(name)
            self.memo[("rule", name)] = body
        return node if name in self.recursive else self.memo[("rule", name)]


def _props_as_rules(node, rules: dict, recursive: set) -> tuple:
    """A ("props", ...) node holding rules, as seq/alt over new nonterminals: ``some(i)``
    (members i.. once one was emitted: each after a separator) is a rule of its own, kept
    (added to ``rules`` and ``recursive``), so both ways into it share it. Spelled out as
    one tree, the two tracks would copy every later member at each optional one: 2^n."""
    _, members, sep, tail_none, tail_some = node
    prefix = f"$props:{id(node)}:"
    rules[f"{prefix}{len(members)}"] = tail_some
    for i in reversed(range(len(members))):
        member, required = members[i]
        later = ("rule", f"{prefix}{i + 1}")
        after_some = ra.seq(sep, member, later)
        rules[f"{prefix}{i}"] = after_some if required else ra.alt(after_some, later)
    recursive.update(f"{prefix}{i}" for i in range(len(members) + 1))
    return _props_none(members, prefix, tail_none)


def _props_none(members, prefix: str, tail_none) -> tuple:
    """What a props node matches before any member was emitted: member i then ``some(i+1)``,
    for every i up to the first required member, or ``tail_none`` if none is required.
    One ``ra.alt`` over all of them (nesting one per member would flatten the growing
    alternation again at every member: n^2 parts checked)."""
    starts = []
    for i, (member, required) in enumerate(members):
        starts.append(ra.seq(member, ("rule", f"{prefix}{i + 1}")))
        if required:
            return ra.alt(*starts)
    return ra.alt(*starts, tail_none) if starts else tail_none


class _Builder:
    def __init__(self, bodies: dict, root: str, ignore, with_rules: dict):
        self.bodies = bodies
        self.nonterminals: dict[str, int] = {}
        self.productions: list[tuple[int, tuple]] = []
        self.terminals: list[tuple] = []
        self.terminal_ids: dict[int, int] = {}        # id(node) -> terminal
        self.terminal_of_value: dict[tuple, int] = {}
        self._sizes: dict = {}          # tree_size memo (id(node) -> unfolded size)
        self.optional_of: dict[int, int] = {}
        self._rules_memo = with_rules   # ra.has_rules memo (id(node) -> bool)
        self._seq_memo: dict = {}      # id(node) -> (node, symbols): the AST is a DAG
        self._keep_alive: list = []
        self.root = root
        self.ignore = tuple(self._terminal_id(node) - _T for node in ignore)

    def build(self) -> GrammarSpec:
        for name in self.bodies:
            self._nonterminal(name)
        for name, body in self.bodies.items():
            lhs = self.nonterminals[name]
            for alternative in self._alternatives(body):
                self.productions.append((lhs, alternative))
        count = len(self.nonterminals)
        nt = count
        # encode terminals after nonterminals
        encoded = [(lhs, tuple(s if s < _T else s - _T + nt for s in rhs))
                   for lhs, rhs in self.productions]
        encoded = _productive_only(encoded, nt, self.nonterminals[self.root])
        earley = EarleyGrammar(nt, encoded, self.nonterminals[self.root], len(self.terminals))
        return GrammarSpec(self.terminals, earley, self.ignore,
                           {v: k for k, v in self.nonterminals.items()})

    def _has_rules(self, node) -> bool:
        return ra.has_rules(node, self._rules_memo)

    def _nonterminal(self, name: str) -> int:
        if name not in self.nonterminals:
            self.nonterminals[name] = len(self.nonterminals)
        return self.nonterminals[name]

    def _fresh(self) -> int:
        return self._nonterminal(f"#{len(self.nonterminals)}")

    def _alternatives(self, node) -> list[tuple]:
        """Productions (symbol tuples) whose union is ``node``."""
        deadline.check()
        if node[0] == "alt" and self._has_rules(node):
            out = []
            for child in node[1]:
                out.extend(self._alternatives(child))
            return out
        return [tuple(self._sequence(node))]

    def _sequence(self, node) -> list[int]:
        found = self._seq_memo.get(id(node))
        if found is None:
            found = (node, self._sequence_uncached(node))
            self._seq_memo[id(node)] = found
        return list(found[1])

    def _sequence_uncached(self, node) -> list[int]:
        if not self._has_rules(node):
            return self._terminal_symbols(node)
        kind = node[0]
        if kind == "rule":
            return [self.nonterminals[node[1]]]
        if kind == "seq":
            out, run = [], []
            for child in node[1]:
                if self._has_rules(child):
                    if run:
                        out += self._terminal_symbols(ra.seq(*run))
                        run = []
                    out += self._sequence(child)
                else:
                    run.append(child)
            if run:
                out += self._terminal_symbols(ra.seq(*run))
            return out
        helper = self._fresh()
        if kind == "alt":
            for alternative in self._alternatives(node):
                self.productions.append((helper, alternative))
        elif kind == "rep":
            self._repetition(helper, node[1], node[2], node[3])
        else:
            raise GrammarError(f"cannot use {kind!r} around grammar rules")
        return [helper]

    def _repetition(self, helper: int, child, lo: int, hi) -> None:
        item = self._sequence(child)
        if hi is None:
            star = self._fresh()
            self.productions.append((star, ()))
            self.productions.append((star, tuple(item) + (star,)))
            self.productions.append((helper, tuple(item) * lo + (star,)))
            return
        tail: tuple = ()
        for _ in range(hi - lo):
            optional = self._fresh()
            self.productions.append((optional, ()))
            self.productions.append((optional, tuple(item) + tail))
            tail = (optional,)
        self.productions.append((helper, tuple(item) * lo + tail))

    def _terminal_symbols(self, node) -> list[int]:
        if node == ra.EMPTY:
            return []
        if node == ra.NOTHING:
            return [self._fresh()]      # a nonterminal without productions: pruned later
        tid = self._terminal_id(node)
        if not ra.matches_empty(node, {}):
            return [tid]
        if tid not in self.optional_of:
            optional = self._fresh()
            self.productions.append((optional, ()))
            self.productions.append((optional, (tid,)))
            self.optional_of[tid] = optional
        return [self.optional_of[tid]]

    def _terminal_id(self, node) -> int:
        key = id(node)
        if key not in self.terminal_ids:
            fresh = len(self.terminals) + _T
            tid = self._equal_terminal(node, fresh)
            if tid == fresh:
                self.terminals.append(node)
            self.terminal_ids[key] = tid
            self._keep_alive.append(node)   # keeps the node (and its id) alive
        return self.terminal_ids[key]

    def _equal_terminal(self, node, fresh: int) -> int:
        """The id of a terminal equal to ``node`` met before, else ``fresh`` (now ``node``'s).
        Equal terminals share one id, so one lazy DFA and its cached rows: a schema repeats
        the same member regexes in many rules (673 terminals, 141 distinct). A tuple's hash
        walks its unfolded tree, so only terminals small enough to be built at all are
        compared, and never one holding a list."""
        if ra.tree_size(node, self._sizes) > _MAX_HASHED_TERMINAL:
            return fresh
        try:
            return self.terminal_of_value.setdefault(node, fresh)
        except TypeError:
            return fresh


_T = 1 << 30    # terminal marker while building (nonterminal count is unknown until the end)
_MAX_HASHED_TERMINAL = 800_000    # automaton.build_nfa refuses larger trees


def _productive_only(productions, nt: int, start: int):
    productive = derivable(productions, given_from=nt)
    if start not in productive:
        raise GrammarError("the grammar's start rule cannot derive any finite string "
                           "(infinite recursion without a base case)")
    return [(lhs, rhs) for lhs, rhs in productions
            if lhs in productive and all(s >= nt or s in productive for s in rhs)]
