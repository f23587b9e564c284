"""The compiled NFA builder (``native.CORE.build_nfa`` / ``build_nfa_node`` / ``nfa_size``)
against its Python reference (``automaton._build_python`` and friends): the same states and
edges in the same order, for the same sequence of builds from empty caches (the fragments
recorded, pasted and minimised along the way are part of what both must agree on), and the
same errors.

The extension must be built (``pip install -e .`` builds it; CI runs that): a missing or
stale build fails these tests instead of skipping them.
"""
import json
import random

import pytest

import random_regexes
from conformance import maskbench_sample, smollm2
from tamis.constrain import ConstraintError, StructuredOutputsParams, automaton, compile_constraint
from tamis.constrain import deadline, native
from tamis.constrain import nfa as nfa_module
from tamis.constrain import regex_ast as ra
from tamis.constrain.regex_parser import parse_regex

SEED = random.randrange(1 << 30)
ATOMS = ["a", "b", "0", " ", "\\n", "é", "😀", "\\.", "\"", "[a-z]", "[^\"\\\\]", "\\d", "\\w",
         ".", "[^x]", "[é-ü]", "[\\t ]"]
CACHES = ("_FRAGMENTS", "_SEEN_ONCE", "_MINIMAL", "_PASTES", "_SIZES")


def python_builder(monkeypatch) -> None:
    monkeypatch.setattr(automaton, "_build", automaton._build_python)
    monkeypatch.setattr(automaton, "_build_node", automaton._build_node_python)
    monkeypatch.setattr(automaton, "_size", automaton._size_python)


def regex_nodes(rng: random.Random, count: int) -> list:
    """Random regexes, each also repeated, counted and sequenced with itself (shared nodes:
    the second sight records a fragment, the eighth paste minimises it)."""
    out = []
    for _ in range(count):
        node = parse_regex(random_regexes.random_regex(rng, ATOMS))
        out += [node, ra.seq(node, node), ra.rep(node, 0, rng.randint(1, 12)),
                ra.seq(ra.rep(node, rng.randint(0, 3), None), node)]
    return out


def schema_nodes(rng: random.Random, count: int) -> list:
    """Every node a LazyDFA was built from while compiling ``count`` maskbench schemas and
    building up to eight of a grammar's terminals (products' operands included)."""
    info = smollm2()[1]
    built = []
    original = automaton.build_nfa

    def recording(node):
        built.append(node)
        return original(node)
    automaton.build_nfa = recording
    try:
        for _, path in rng.sample(maskbench_sample(3), count):
            try:
                compiled = compile_constraint(
                    StructuredOutputsParams(json=json.loads(path.read_text())["schema"]), info)
                if hasattr(compiled, "dfas"):
                    for i in rng.sample(range(len(compiled.dfas)), min(8, len(compiled.dfas))):
                        compiled.dfas[i]
            except ConstraintError:
                continue
    finally:
        automaton.build_nfa = original
    return built


def build_all(monkeypatch, nodes: list) -> list:
    """(states, edge rows, epsilon rows, may_dead_end, start, accept) or the error, per node,
    each node built from empty caches as they stand after the nodes before it."""
    for cache in CACHES:
        monkeypatch.setattr(automaton, cache, {})
    out = []
    for node in nodes:
        try:
            nfa, start, accept = automaton.build_nfa(node)
        except ConstraintError as error:
            out.append(str(error))
            continue
        out.append((nfa.num_states, nfa.edge_table.tobytes(), nfa.eps_table.tobytes(),
                    nfa.may_dead_end, start, accept))
    return out


def compare(monkeypatch, nodes: list) -> None:
    compiled = build_all(monkeypatch, nodes)
    with monkeypatch.context() as patch:
        python_builder(patch)
        reference = build_all(patch, nodes)
    assert len(compiled) == len(reference)
    for i, (ours, theirs) in enumerate(zip(compiled, reference)):
        assert ours == theirs, f"node {i}: {repr(nodes[i])[:200]}"


@pytest.mark.parametrize("seed", [SEED])
def test_random_regexes_build_the_same_nfa(core, monkeypatch, seed):
    compare(monkeypatch, regex_nodes(random.Random(seed), 30))


@pytest.mark.parametrize("seed", [SEED])
def test_schema_terminals_build_the_same_nfa(core, monkeypatch, seed):
    nodes = schema_nodes(random.Random(seed), 6)
    assert nodes
    compare(monkeypatch, nodes)


def test_the_core_builds_when_it_is_on(core, monkeypatch):
    """The dispatchers take the compiled builder: a node built with it leaves no call of
    the Python builder for the plain kinds."""
    called = []
    monkeypatch.setattr(native, "CORE", core)
    monkeypatch.setattr(automaton, "_build_python", lambda *a: called.append(a))
    automaton.build_nfa(parse_regex("(ab|cd)*x{3,5}"))
    assert called == []


def test_sizes_equal_the_python_sizes(core, monkeypatch):
    rng = random.Random(SEED)
    nodes = regex_nodes(rng, 20) + [ra.rep(ra.rep(parse_regex("a{1000}"), 0, 1000), 0, 1000)]
    for cache in CACHES:
        monkeypatch.setattr(automaton, cache, {})
    compiled = [automaton._size(node) for node in nodes]
    for cache in CACHES:
        monkeypatch.setattr(automaton, cache, {})
    reference = [automaton._size_python(node) for node in nodes]
    # past 2**60 the compiled size saturates: only a comparison with the state limit reads it
    assert compiled == [min(size, 1 << 60) for size in reference]


@pytest.mark.parametrize("make_node, limit", [
    (lambda: ra.seq(parse_regex("ab"), ("rule", "value")), None),       # a rule reference
    (lambda: parse_regex("[a-z]{400}"), 300),                           # past the state limit
])
def test_errors_are_the_python_builders(core, monkeypatch, make_node, limit):
    messages = []
    for python in (False, True):
        with monkeypatch.context() as patch:
            if python:
                python_builder(patch)
            if limit is not None:
                patch.setattr(nfa_module, "MAX_NFA_STATES", limit)
            with pytest.raises(ConstraintError) as error:
                automaton.build_nfa(make_node())
            messages.append(str(error.value))
    assert messages[0] == messages[1]


def test_an_expired_deadline_stops_the_build(core):
    node = parse_regex("[a-z]{3000}")
    with deadline.deadline(0):
        with pytest.raises(ConstraintError, match="time limit|deadline|exceeded"):
            automaton.build_nfa(node)


def test_built_asts_are_untracked_where_the_collector_would_untrack_them(core):
    """``build_nfa`` untracks the AST's tuples (nothing in them may be tracked), not a
    tuple that holds a tracked object."""
    import gc
    node = ra.seq(parse_regex("(ab|c[d-f])*"), parse_regex("x{2,4}"))
    assert gc.is_tracked(node)
    automaton.build_nfa(node)
    assert not gc.is_tracked(node) and not gc.is_tracked(node[1][0])
    holder = ("seq", (node, [1, 2]))                  # a list may be part of a cycle
    assert core.untrack_ast(holder) is False
    assert gc.is_tracked(holder) and gc.is_tracked(holder[1])
