"""constrain/regex_ast.py: ``is_small`` (cached sizes of sub-nodes) agrees with counting the
unfolded tree, on random DAGs of shared nodes, asked in any order."""
import random

from tamis.constrain import regex_ast as ra
from tamis.constrain.json_strings import ANY_STRING, STRING_UNIT


def _tree_size_past(node, limit: int) -> int:
    """Nodes of the unfolded tree, counted one by one up to ``limit + 1``."""
    stack, count = [node], 0
    while stack and count <= limit:
        count += 1
        stack.extend(ra.children(stack.pop()))
    return count


def test_is_small_counts_the_unfolded_tree():
    rng = random.Random(3)
    nodes = [ra.char(c) for c in "abcdef"] + [STRING_UNIT, ANY_STRING, ra.EMPTY]
    for _ in range(3000):
        a, b, c = rng.choice(nodes), rng.choice(nodes), rng.choice(nodes)
        pick = rng.random()
        if pick < 0.4:
            node = ("seq", (a, b))
        elif pick < 0.7:
            node = ("alt", (a, b, c))
        else:
            node = ("rep", a, 0, rng.randint(1, 3))
        nodes.append(node)
    asked = rng.sample(nodes, 1500)
    for node in asked + asked[::-1]:
        assert ra.is_small(node) == (_tree_size_past(node, ra._HASHED_NODES) <= ra._HASHED_NODES)
    assert any(ra.is_small(n) for n in asked) and not all(ra.is_small(n) for n in asked)


def test_a_node_holding_a_list_is_never_small():
    assert not ra.is_small(("alt", [ra.char("a"), ra.char("b")]))
