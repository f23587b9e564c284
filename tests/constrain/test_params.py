"""StructuredOutputsParams: vLLM's fields, exactly one constraint, cheap validation."""
import pytest
from pydantic import BaseModel

from tamis.constrain import StructuredOutputsParams


def test_fields_match_vllm():
    from dataclasses import fields
    names = {f.name for f in fields(StructuredOutputsParams)}
    assert names == {"json", "regex", "choice", "grammar", "json_object", "structural_tag",
                     "disable_any_whitespace", "disable_additional_properties",
                     "whitespace_pattern"}


def test_two_constraints_rejected_with_vllm_wording():
    with pytest.raises(ValueError, match="You can only use one kind of structured outputs constraint"):
        StructuredOutputsParams(regex="a+", choice=["a"])


def test_no_constraint_rejected():
    with pytest.raises(ValueError, match="none is specified"):
        StructuredOutputsParams()


def test_pydantic_model_becomes_schema():
    class Car(BaseModel):
        brand: str
        year: int

    params = StructuredOutputsParams(json=Car)
    assert params.json["properties"]["year"]["type"] == "integer"
    assert params.kind == "json"


@pytest.mark.parametrize("kwargs, message", [
    ({"choice": []}, "non-empty list"),
    ({"choice": ["a", 3]}, "only strings"),
    ({"json": "{not json"}, "not valid JSON"),
    ({"grammar": "   "}, "non-empty string"),
    ({"structural_tag": "{}"}, "structures must be a list"),
])
def test_validate_rejects_bad_input(kwargs, message):
    with pytest.raises(ValueError, match=message):
        StructuredOutputsParams(**kwargs).validate()


def test_spec_key_is_stable_for_equal_schemas():
    a = StructuredOutputsParams(json={"type": "object", "properties": {"a": {"type": "string"}}})
    b = StructuredOutputsParams(json={"properties": {"a": {"type": "string"}}, "type": "object"})
    assert a.spec_key() == b.spec_key()
    assert a.spec_key() != StructuredOutputsParams(json=a.json, disable_any_whitespace=True).spec_key()
