"""The compiled core's product walk (``native.CORE.product_runs``) against its Python
reference (``product._ProductBuilder._explore_python``): the same pairs, numbered alike, the
same runs and accepting flags, the operands' rows built in the same order; and the same NFA
from ``product.build_product`` either way. Random intersections and differences of regexes,
over character classes and over bytes, and intersections with a repetition whose units are
counted (``product._UnitCounter``).

The extension must be built (``pip install -e .``): a missing or stale build fails these
tests instead of skipping them.
"""
import random

import numpy as np
import pytest

import random_regexes
from tamis.constrain import ConstraintError, deadline, native, product
from tamis.constrain import regex_ast as ra
from tamis.constrain.nfa import NFA
from tamis.constrain.regex_parser import parse_regex

SEED = random.randrange(1 << 30)
ATOMS = ["a", "b", "c", "0", " ", "é", "😀", "[a-c]", "[^a]", "[0-9]", "\\w", ".", "[é-ü]"]


def random_regex(rng: random.Random) -> str:
    return random_regexes.random_regex(rng, ATOMS, ("*", "+", "?", "{1,4}", "{2}"))


def operands(rng: random.Random, count: int) -> list:
    out = []
    while len(out) < count:
        a, b = random_regex(rng), random_regex(rng)
        out.append((f"{a} {b}", parse_regex(a), parse_regex(b)))
    return out


def builder(a, b, mode: str, by_bytes: bool) -> "product._ProductBuilder":
    """A fresh builder as ``build_product`` makes it: over character classes, or bytes."""
    alphabet = None if by_bytes else product._char_classes(a, b)
    if alphabet is None:
        return product._ProductBuilder(NFA(), a, b, mode, None)
    classes, ids_of = alphabet
    memo: dict = {}
    return product._ProductBuilder(NFA(), product._renamed(a, ids_of, memo),
                                   product._renamed(b, ids_of, memo), mode, classes)


def alphabet_of(built) -> int:
    return 256 if built.classes is None else len(built.classes)


def dfa_state(dfa) -> tuple:
    rows = dfa.trans[:dfa.num_states]
    return list(dfa.sets), rows.tobytes(), list(dfa.accepting)


@pytest.mark.parametrize("seed", [SEED])
@pytest.mark.parametrize("by_bytes", [False, True])
def test_pairs_equal_the_python_walk(core, seed, by_bytes):
    for description, a, b in operands(random.Random(seed), 60):
        for mode in ("and", "diff"):
            reference, compiled = builder(a, b, mode, by_bytes), builder(a, b, mode, by_bytes)
            if reference.settle is not None or reference.left.start < 0:
                continue            # a length counter, or nothing to walk: Python only
            pairs, accepting, runs = reference._explore_python(alphabet_of(reference))
            found = compiled.core_runs(core, alphabet_of(compiled))
            context = (seed, description, mode)
            assert np.frombuffer(found[0], np.int32).reshape(-1, 2).tolist() == \
                [list(p) for p in pairs], context
            assert np.frombuffer(found[1], np.bool_).tolist() == accepting.tolist(), context
            assert np.frombuffer(found[2], np.int32).reshape(-1, 4).tolist() == runs.tolist(), context
            assert dfa_state(compiled.left) == dfa_state(reference.left), context
            if compiled.counter is None:
                assert dfa_state(compiled.right) == dfa_state(reference.right), context


UNITS = [r"[a-c]", r"a|bc", r'\\["\\]|[^"\\]', r"a*b", r"é|😀", r"[0-9]{2}", r"\w\w?0"]


def counted_operands(rng: random.Random, count: int) -> list:
    """(description, a, rep(unit, lo, hi)): right sides a ``_UnitCounter`` counts."""
    out = []
    while len(out) < count:
        a, unit, lo = random_regex(rng), rng.choice(UNITS), rng.randint(0, 30)
        hi = rng.choice([None, rng.randint(lo, 30)])
        out.append((f"{a} ({unit}){{{lo},{hi}}}", parse_regex(a), ra.rep(parse_regex(unit), lo, hi)))
    return out


@pytest.mark.parametrize("seed", [SEED])
@pytest.mark.parametrize("by_bytes", [False, True])
def test_counted_pairs_equal_the_python_walk(core, monkeypatch, seed, by_bytes):
    """A count of units on the right: rows and accepting flags computed on both sides."""
    monkeypatch.setattr(product, "MIN_COUNTED_UNITS", 0)
    for description, a, b in counted_operands(random.Random(seed + 2), 40):
        reference, compiled = builder(a, b, "and", by_bytes), builder(a, b, "and", by_bytes)
        if reference.counter is None or reference.left.start < 0:
            continue
        pairs, accepting, runs = reference._explore_python(alphabet_of(reference))
        found = compiled.core_runs(core, alphabet_of(compiled))
        context = (seed, description)
        assert np.frombuffer(found[0], np.int32).reshape(-1, 2).tolist() == \
            [list(p) for p in pairs], context
        assert np.frombuffer(found[1], np.bool_).tolist() == accepting.tolist(), context
        assert np.frombuffer(found[2], np.int32).reshape(-1, 4).tolist() == runs.tolist(), context
        assert dfa_state(compiled.left) == dfa_state(reference.left), context


def test_counter_arguments_are_checked(core):
    built = builder(parse_regex("(ab)*"), ra.rep(parse_regex("ab"), 20, None), "and", True)
    rows, lo, cap, saturate = built.counter.core_args()
    for bad in [(rows[:, :3], lo, cap, saturate), (rows + 5, lo, cap, saturate),
                (rows, lo, 1 << 30, saturate)]:
        with pytest.raises(ValueError):
            core.product_runs(built.left, None, built.left.start, 0, 256, False,
                              product.MAX_PRODUCT_STATES, deadline.check, bad)


def sealed_tables(node, mode, monkeypatch, core_or_none):
    monkeypatch.setattr(native, "CORE", core_or_none)
    nfa = NFA()
    start = nfa.new_state()
    end = product.build_product(nfa, node[0], node[1], start, mode)
    nfa.seal()
    return nfa.num_states, end, nfa.edge_table.tobytes(), nfa.eps_table.tobytes()


@pytest.mark.parametrize("seed", [SEED])
def test_build_product_writes_the_same_nfa_either_way(core, monkeypatch, seed):
    monkeypatch.setattr(product, "MIN_COUNTED_UNITS", 0)
    drawn = operands(random.Random(seed + 1), 40) + counted_operands(random.Random(seed + 3), 20)
    for description, a, b in drawn:
        for mode in ("and", "diff"):
            assert sealed_tables((a, b), mode, monkeypatch, core) == \
                sealed_tables((a, b), mode, monkeypatch, None), (seed, description, mode)


@pytest.mark.parametrize("use_core", [True, False])
def test_too_many_pairs_is_refused_either_way(core, monkeypatch, use_core):
    monkeypatch.setattr(native, "CORE", core if use_core else None)
    monkeypatch.setattr(product, "MAX_PRODUCT_STATES", 5)
    nfa = NFA()
    with pytest.raises(ConstraintError, match="too big"):
        product.build_product(nfa, parse_regex("[a-z]{8}"), parse_regex("[a-m]*"), nfa.new_state(), "and")


def test_the_deadline_is_checked_inside_the_walk(core):
    built = builder(parse_regex("[a-z]{3000}"), parse_regex("[a-m]*"), "diff", False)

    def expired():
        raise TimeoutError("deadline")
    with pytest.raises(TimeoutError):
        core.product_runs(built.left, built.right, built.left.start, built.right.start,
                          alphabet_of(built), True, product.MAX_PRODUCT_STATES, expired)
