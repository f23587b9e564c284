"""constrain/earley.py: a set finds the sets before it by jump pointers (the same ones as
following ``previous``, in O(log n) hops), and long parses complete against far origins."""
import random

from tamis.constrain.earley import EarleyGrammar

A, B = 0, 1          # terminals


def _list_grammar() -> EarleyGrammar:
    """S -> '[' L ']' ; L -> A | A L  (nonterminals S = 0, L = 1; terminals 2 + t)."""
    nt = 2
    open_, close = 2, 3
    return EarleyGrammar(nt, [(0, (nt + open_, 1, nt + close)), (1, (nt + A,)), (1, (nt + A, 1))],
                         0, 4)


def _hops(node, position) -> int:
    count = 0
    while node.position > position:
        jump = node._jump
        node = jump if jump is not None and jump.position >= position else node.previous
        count += 1
    return count


def test_ancestors_by_jump_pointers_are_the_previous_chain():
    grammar = _list_grammar()
    chain = [grammar.initial_set().scan(2)]
    for _ in range(600):
        chain.append(chain[-1].scan(A))
    assert all(s is not None for s in chain)
    rng = random.Random(0)
    for _ in range(300):
        last = rng.randrange(len(chain))
        position = rng.randrange(chain[0].position, chain[last].position + 1)
        found = chain[last].ancestor(position)
        assert found is chain[position - chain[0].position]
        assert _hops(chain[last], position) <= 4 * len(chain).bit_length()


def test_a_long_list_completes_against_its_opening_bracket():
    grammar = _list_grammar()
    state = grammar.initial_set().scan(2)
    for _ in range(500):
        state = state.scan(A)
        assert not state.accepting
    end = state.scan(3)
    assert end is not None and end.accepting
    assert state.scan(B) is None


def test_a_parse_is_freed_with_its_last_holder_without_the_collector():
    """A set links forward to its successors weakly: a parse forms no reference cycle, so
    its sets go as soon as nothing holds the last one (no full collection needed), while a
    successor that is still held is found again by the same scan."""
    import gc
    import weakref
    grammar = _list_grammar()
    root = grammar.initial_set()
    gc.disable()
    try:
        last = root.scan(2)
        for _ in range(50):
            last = last.scan(A)
        first_after_root = root.scan(2)
        assert first_after_root is root.scan(2)          # held: the same successor
        watched = weakref.ref(last.ancestor(first_after_root.position + 10))
        del last
        assert watched() is None                         # freed by reference counting
        assert root.scan(2) is first_after_root
        assert root.scan(B) is None and root.scan(B) is None       # not expected here
    finally:
        gc.enable()
