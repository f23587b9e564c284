"""The DFA's index of NFA state sets in the compiled core (``NFARows.state_of`` / ``build``,
``LazyDFA.sets`` read from it) against the Python index (a dict of tuples): the same states
numbered alike, the same ``sets``, ``accepting`` and ``accepting_array()``, and the same
token masks over maskbench walks.

The extension must be built (``pip install -e .``): a missing or stale build fails these
tests instead of skipping them.
"""
import hashlib
import json
import random

import numpy as np
import pytest

from conformance import compact, in_schema_order, maskbench_sample, smollm2
from tamis.constrain import ConstraintError, StructuredOutputsParams, compile_constraint, native
from tamis.constrain.automaton import DEAD, LazyDFA, build_nfa
from tamis.constrain.regex_parser import parse_regex

SEED = random.randrange(1 << 30)


def both(monkeypatch, core, make):
    """(Python-index object, compiled-index object) made by ``make()``."""
    monkeypatch.setattr(native, "CORE", None)
    reference = make()
    monkeypatch.setattr(native, "CORE", core)
    compiled = make()
    return reference, compiled


def explore_all(dfa: LazyDFA, limit: int) -> None:
    order, seen = [dfa.start], {dfa.start}
    for state in order:
        if len(order) >= limit:
            break
        for target in dfa.row(state).tolist():
            if target >= 0 and target not in seen:
                seen.add(target)
                order.append(target)


def assert_same(reference: LazyDFA, compiled: LazyDFA) -> None:
    assert compiled._native_rows is not None and reference._native_rows is None
    assert compiled.num_states == reference.num_states
    assert list(compiled.sets) == list(reference.sets)
    assert compiled.sets == reference.sets
    assert compiled.accepting == reference.accepting
    assert compiled.accepting_array().tolist() == reference.accepting_array().tolist()
    assert all(compiled.accepting[s] == (compiled.nfa_accept in compiled.sets[s])
               for s in range(compiled.num_states))
    n = reference.num_states
    built = reference.trans[:n, 0] != -2
    assert (compiled.trans[:n, 0] != -2).tolist() == built.tolist()
    assert (compiled.trans[:n][built] == reference.trans[:n][built]).all()


@pytest.mark.parametrize("pattern", [
    r"[a-z]{0,700}",                               # past the first tables (64 rows, 256 slots)
    r"(a|b|c)*abc(a|b)*c{3,40}",
    r'"([^"\\]|\\u[0-9a-f]{4}|\\.){0,30}"',
    r"(\d+\.\d*|é+€?😀){1,20}",
])
def test_many_states_numbered_alike(core, monkeypatch, pattern):
    nfa, start, accept = build_nfa(parse_regex(pattern))    # one NFA for both

    def make():
        dfa = LazyDFA.from_nfa(nfa, accept)
        dfa.start = dfa.start_at(start)
        return dfa
    reference, compiled = both(monkeypatch, core, make)
    explore_all(reference, 3000)
    explore_all(compiled, 3000)
    assert reference.num_states > 20
    assert_same(reference, compiled)


@pytest.mark.parametrize("seed", [SEED])
def test_states_added_by_name_numbered_alike(core, monkeypatch, seed):
    """States named by NFA sets (the row workers' ``state_of_set``) between rows, in a random
    order, found again by name, and the empty set DEAD."""
    rng = random.Random(seed)
    nfa, start, accept = build_nfa(parse_regex(r'\{"[a-z]{1,6}":(\d{1,4}|"[^"]{0,8}")\}'))
    source = LazyDFA.from_nfa(nfa, accept)
    source.start = source.start_at(start)
    explore_all(source, 500)
    names = list(source.sets)
    rng.shuffle(names)

    def make():
        dfa = LazyDFA.from_nfa(nfa, accept)
        got = [dfa.state_of_set(name) for name in names[:len(names) // 2]]
        for state in rng.sample(range(len(got)), min(30, len(got))):
            dfa.row(state)
        got += [dfa.state_of_set(name) for name in names]
        got.append(dfa.state_of_set(()))
        return dfa, got
    state = rng.getstate()
    (reference, want), (compiled, got) = both(monkeypatch, core, lambda: (rng.setstate(state), make())[1])
    assert got == want and got[-1] == DEAD
    assert [compiled.sets[s] for s in got[:-1]] == [tuple(name) for name in names[:len(names) // 2]] + \
        [tuple(name) for name in names]
    assert_same(reference, compiled)


def test_sets_read_like_a_list(core, monkeypatch):
    monkeypatch.setattr(native, "CORE", core)
    dfa = LazyDFA(parse_regex("ab*c|d"))
    explore_all(dfa, 100)
    sets = dfa.sets
    assert len(sets) == dfa.num_states >= 3
    assert sets[-1] == sets[len(sets) - 1] and sets[1:3] == [sets[1], sets[2]]
    assert all(isinstance(s, tuple) and list(s) == sorted(s) for s in sets)
    with pytest.raises(IndexError):
        sets[len(sets)]
    with pytest.raises(IndexError):
        dfa._native_rows.set_of(len(sets))
    with pytest.raises(ValueError):
        dfa._native_rows.state_of((dfa.nfa.num_states,))
    assert dfa.state_of_set(sets[1]) == 1 and dfa.num_states == len(sets)


def _mask_digest(compiled_constraint, texts) -> str:
    tokenizer, info = smollm2()
    digest = hashlib.sha256()
    for text in texts:
        matcher = compiled_constraint.matcher()
        bitmask = np.zeros((1, info.num_words), dtype=np.int32)
        for token in tokenizer.encode(text, add_special_tokens=False) + [info.eos_token_ids[0]]:
            matcher.fill_bitmask(bitmask, 0)
            digest.update(bitmask.tobytes())
            if not matcher.accept(token):
                break
    return digest.hexdigest()


@pytest.mark.parametrize("seed", [SEED])
def test_masks_equal_over_maskbench_walks(core, monkeypatch, seed):
    """Masks of whole walks (schemas compiled afresh under each index) hash alike."""
    info = smollm2()[1]
    files = [path for _, path in maskbench_sample(3)]
    for path in random.Random(seed).sample(files, 6):
        doc = json.loads(path.read_text())
        texts = [compact(in_schema_order(test["data"], doc["schema"])) for test in doc["tests"][:3]]

        def make():
            try:
                return compile_constraint(StructuredOutputsParams(json=doc["schema"]), info)
            except ConstraintError:
                return None
        reference, compiled = both(monkeypatch, core, make)
        if reference is None:
            continue
        monkeypatch.setattr(native, "CORE", None)
        want = _mask_digest(reference, texts)
        monkeypatch.setattr(native, "CORE", core)
        assert _mask_digest(compiled, texts) == want, (seed, path.name)


@pytest.mark.parametrize("pattern", ["(ab|cd)*e?", "x{2,5}(y|z)*", "a*|b+|()", "[é-ü]+\\d?"])
def test_start_at_every_nfa_state_numbers_states_alike(monkeypatch, core, pattern):
    """``start_at`` (the compiled ``NFARows.state_at``: one state's closure, indexed) against
    the Python closure and index, from every NFA state in turn."""
    reference, compiled = both(monkeypatch, core, lambda: LazyDFA(parse_regex(pattern)))
    for q in range(compiled.nfa.num_states):
        assert compiled.start_at(q) == reference.start_at(q), q
    assert_same(reference, compiled)
