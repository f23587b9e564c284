"""The compiled Earley closure (``native.CORE.EarleyTables``) against its Python reference
(``earley.EarleySet._closure``): along random parses of json.gbnf and of maskbench schemas
compiled to grammars, every set made both ways has the same ``waiting`` (symbol for symbol,
item for item, in the same order), ``expected`` and ``accepting``.

The extension must be built (``pip install -e .`` builds it; CI runs that): a missing or
stale build fails these tests instead of skipping them.
"""
import json
import random
from array import array

import pytest

from conformance import CONFORMANCE, maskbench_sample, smollm2
from tamis.constrain import ConstraintError, StructuredOutputsParams, compile_constraint, native
from tamis.constrain.earley import EarleySet

SEED = random.randrange(1 << 30)


def grammars(rng: random.Random, count: int) -> list:
    """json.gbnf's Earley grammar and those of ``count`` maskbench schemas that compile to
    grammars (sampled)."""
    info = smollm2()[1]
    gbnf = (CONFORMANCE / "grammars/gbnf/llama.cpp-grammars/json.gbnf").read_text()
    out = [compile_constraint(StructuredOutputsParams(grammar=gbnf), info).spec.earley]
    for _, path in rng.sample(maskbench_sample(3), len(maskbench_sample(3))):
        if len(out) > count:
            break
        try:
            compiled = compile_constraint(
                StructuredOutputsParams(json=json.loads(path.read_text())["schema"]), info)
        except ConstraintError:
            continue
        if hasattr(compiled, "spec"):
            out.append(compiled.spec.earley)
    return out


def made_both_ways(monkeypatch, core, grammar, previous, kernel) -> tuple:
    monkeypatch.setattr(native, "CORE", None)
    reference = EarleySet(grammar, previous, kernel)
    monkeypatch.setattr(native, "CORE", core)
    return reference, EarleySet(grammar, previous, kernel)


@pytest.mark.parametrize("seed", [SEED])
def test_closures_equal_the_python_closure(monkeypatch, core, seed):
    rng = random.Random(seed)
    checked = 0
    for grammar in grammars(rng, 5):
        for _ in range(3):                          # three random parses a grammar
            kernel = {(p, 0, 0) for p in grammar.by_lhs[grammar.start]}
            previous = None
            for _ in range(60):
                reference, compiled = made_both_ways(monkeypatch, core, grammar, previous, kernel)
                assert compiled.waiting == reference.waiting
                assert [tuple(v) for v in compiled.waiting.values()] == \
                    [tuple(v) for v in reference.waiting.values()]
                assert list(compiled.waiting) == list(reference.waiting)
                assert compiled.expected == reference.expected
                assert compiled.accepting == reference.accepting
                checked += 1
                if not compiled.expected:
                    break
                terminal = rng.choice(sorted(compiled.expected))
                symbol = terminal + grammar.num_nonterminals
                kernel = {(p, d + 1, o) for p, d, o in compiled.waiting[symbol]}
                previous = compiled
    assert checked > 100


def test_bad_tables_and_kernels_are_refused(core):
    """S -> a (nonterminal 0, terminal symbol 1): a right-hand side naming a symbol past
    the grammar, or a kernel item past its productions, is refused."""
    def ints(*values):
        return array("i", values)
    with pytest.raises(ValueError, match="out of range"):
        core.EarleyTables(1, 2, 0, ints(0), ints(0, 1), ints(5), ints(0, 1), ints(0), b"\0")
    tables = core.EarleyTables(1, 2, 0, ints(0), ints(0, 1), ints(1), ints(0, 1), ints(0), b"\0")
    with pytest.raises(ValueError, match="kernel item out of range"):
        tables.closure([(3, 0, 0)], 0, None)
    waiting, accepting = tables.closure([(0, 0, 0)], 0, None)
    assert waiting == {1: ((0, 0, 0),)} and accepting is False
    assert tables.closure([(0, 1, 0)], 0, None) == ({}, True)     # complete at origin 0
