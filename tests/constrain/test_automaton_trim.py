"""The NFA is trimmed only when a construct can leave a dead end; either way every live DFA
state must still be completable (a mask never allows a token into a dead end)."""
import pytest

from tamis.constrain import regex_ast as ra
from tamis.constrain.automaton import LazyDFA, build_nfa
from tamis.constrain.regex_parser import parse_regex


def _all_states_completable(dfa: LazyDFA) -> bool:
    seen, stack = {dfa.start}, [dfa.start]
    while stack:
        for t in set(dfa.row(stack.pop()).tolist()) - {-1}:
            if t not in seen:
                seen.add(t)
                stack.append(t)
    edges = {s: set(dfa.row(s).tolist()) - {-1} for s in seen}
    good = {s for s in seen if dfa.is_accepting(s)}
    changed = True
    while changed:
        new = {s for s in seen if edges[s] & good} - good
        good |= new
        changed = bool(new)
    return good == seen


DEAD_END_NODES = [
    ("alt", (ra.literal("ab"), ("seq", (ra.literal("cd"), ("chars", ()))))),
    ("alt", (ra.literal("xy"), ("seq", (ra.literal("zw"), ("alt", ()))))),
    ("alt", (ra.literal("12"), ("and", parse_regex("[a-c]+x"), parse_regex("[a-z]+y")))),
    ("multiple", 3, 1),
]


@pytest.mark.parametrize("node", DEAD_END_NODES)
def test_dead_end_constructs_are_trimmed(node):
    nfa, _, _ = build_nfa(node)
    assert nfa.may_dead_end
    assert _all_states_completable(LazyDFA(node, allow_empty_language=True))


@pytest.mark.parametrize("pattern", [r"(ab|cd)*e{2,5}", r'"([^"\\]|\\.)*"', r"[a-z]+(,[a-z]+){0,3}"])
def test_plain_constructs_need_no_trim(pattern):
    node = parse_regex(pattern)
    nfa, _, _ = build_nfa(ra.seq(node, node))        # shared node: pasted as a fragment
    assert not nfa.may_dead_end
    assert _all_states_completable(LazyDFA(ra.seq(node, node)))
