"""constrain/structural_tag.py: vLLM's structural_tag, in both of xgrammar's spellings, through
tamis's matcher (the cases are vLLM's, tests/data/conformance/vllm-cases/structural_tag)."""
import json

import pytest

from conformance import CONFORMANCE, smollm2
from tamis.constrain import ConstraintError, StructuredOutputsParams, compile_constraint

CASES = CONFORMANCE / "vllm-cases" / "structural_tag"


def _compile(spec):
    return compile_constraint(StructuredOutputsParams(structural_tag=spec), smollm2()[1])


def _complete(compiled, text: str) -> bool:
    matcher = compiled.matcher()
    return matcher.accept_bytes(text.encode()) and matcher.is_complete()


def test_legacy_structures_hold_their_schema_after_a_trigger():
    compiled = _compile((CASES / "legacy_structures_get_weather.json").read_text())
    assert _complete(compiled, "Let me check. ")
    assert _complete(compiled, 'Sure <function=get_weather>{"city":"Paris"}</function> done')
    assert _complete(compiled, '<function=get_weather>{"city":"A"}</function>'
                               '<function=get_weather>{}</function>')
    assert not _complete(compiled, "<function=get_time>{}</function>")       # trigger, no tag
    assert not _complete(compiled, '<function=get_weather>{"city":1}</function>')
    assert not _complete(compiled, '<function=get_weather>{"city":"A"}')       # unclosed


def test_triggered_tags_with_any_text():
    spec = json.loads((CASES / "triggered_tags_any_text.json").read_text())
    compiled = _compile(spec)
    assert _complete(compiled, "say hello_flag anything at all hello and more")
    assert not _complete(compiled, "say hello there")       # a trigger that opens no tag
    spec["format"]["stop_after_first"] = True
    once = _compile(spec)
    assert _complete(once, "x hello_flag y hello")
    assert not _complete(once, "x hello_flag y hello z")


@pytest.mark.parametrize("spec, fragment", [
    ("{not json", "not valid JSON"),
    ({"type": "structural_tag", "format": {"type": "sequence"}}, "triggered_tags"),
    ({"type": "structural_tag", "structures": [{"begin": "<a>", "schema": {}, "end": "</a>"}],
      "triggers": ["<b"]}, "starts with none of the triggers"),
    ({"type": "structural_tag", "format": {"type": "triggered_tags", "triggers": ["<"],
      "tags": [{"begin": "<a>", "content": {"type": "regex"}, "end": ""}]}}, "content"),
])
def test_bad_specs_name_the_field(spec, fragment):
    with pytest.raises(ConstraintError, match=fragment):
        StructuredOutputsParams(structural_tag=spec).validate()
        _compile(spec)
