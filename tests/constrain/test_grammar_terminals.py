"""constrain/grammar.py: equal terminals of a grammar share one id (one automaton, one row
cache) and the language is unchanged."""
import pytest

from conformance import smollm2
from tamis.constrain import StructuredOutputsParams, compile_constraint
from tamis.constrain import regex_ast as ra

NESTED = 'root ::= "key=" r "key=" r\nr ::= "x" | "(" r ")"\n'


@pytest.fixture(scope="module")
def info():
    return smollm2()[1]


def test_equal_terminals_share_one_id(info):
    compiled = compile_constraint(StructuredOutputsParams(grammar=NESTED), info)
    terminals = compiled.spec.terminals
    assert len(terminals) == len(set(terminals))
    assert terminals.count(ra.literal("key=")) == 1          # written twice in the grammar
    for text, expected in [("key=xkey=((x))", True), ("key=(x)key=x", True),
                           ("key=xkey=(x", False), ("key=xkey=", False), ("key=x", False)]:
        matcher = compiled.matcher()
        assert (matcher.accept_bytes(text.encode()) and matcher.is_complete()) == expected, text

