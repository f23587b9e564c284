"""vLLM's structured-output fixtures (conformance/vllm-cases), model-free part: every schema,
regex, choice list and grammar compiles (or fails the way vLLM's tests require), and the
ground-truth strings are accepted."""
import json

import pytest

from conformance import CONFORMANCE, compact, smollm2, walk
from tamis.constrain import StructuredOutputsParams, compile_constraint

CASES = CONFORMANCE / "vllm-cases"
SQL_TRUTH = "SELECTcol_1fromtable_1wherecol_1=1"


def _compile(**kwargs):
    return compile_constraint(StructuredOutputsParams(**kwargs), smollm2()[1])


@pytest.mark.parametrize("name", ["sample_json_schema.json", "sample_json_schema.v1-older.json",
                                  "unsupported_json_schema.v1-older.json", "sample_complex_json_schema.json",
                                  "sample_definition_json_schema.json", "sample_enum_json_schema.json",
                                  "car_description.pydantic.json", "min_max_length_50.json",
                                  "reasoning_result.json", "guidance_no_additional_properties.json",
                                  "response_format_result.json", "xgrammar_supported_schema.json"])
def test_schemas_compile(name):
    schema = json.loads((CASES / "schemas" / name).read_text())
    compiled = _compile(json=schema)
    assert compiled.matcher() is not None


def test_bench_schema_and_instance():
    schema = json.loads((CASES / "bench" / "structured_schema_1.json").read_text())
    compiled = _compile(json=schema)
    assert not walk(compiled, "{}")[0] or not schema.get("required")


@pytest.mark.parametrize("path", ["regex/sample_regex.ipv4.txt", "regex/example_email.txt",
                                  "bench/regex_email.txt"])
def test_regexes_compile(path):
    pattern = (CASES / path).read_text().strip("\n")
    assert _compile(regex=pattern).matcher() is not None


def test_ipv4_regex_accepts_an_address():
    pattern = (CASES / "regex/sample_regex.ipv4.txt").read_text().strip("\n")
    compiled = _compile(regex=pattern)
    assert walk(compiled, "192.168.0.1")[0] and not walk(compiled, "192.168.0")[0]


@pytest.mark.parametrize("path", ["choice/sample_structured_outputs_choices.json",
                                  "choice/example_sentiment.json", "bench/choice_sentiment.json"])
def test_choices(path):
    choices = json.loads((CASES / path).read_text())
    compiled = _compile(choice=choices)
    assert all(walk(compiled, c)[0] for c in choices)
    assert not walk(compiled, choices[0] + "x")[0]


@pytest.mark.parametrize("path", ["grammars/sample_sql.ebnf", "grammars/sample_sql.lark"])
def test_sql_grammars_accept_the_ground_truth(path):
    compiled = _compile(grammar=(CASES / path).read_text())
    assert walk(compiled, SQL_TRUTH)[0]
    assert not walk(compiled, "SELECT col_1 from table_1 where col_1 = 1")[0]


@pytest.mark.parametrize("path", ["grammars/example_sql_spaced.ebnf", "bench/grammar_sql_spaced.ebnf"])
def test_spaced_sql_grammars_compile(path):
    assert _compile(grammar=(CASES / path).read_text()).matcher() is not None


def test_xgrammar_id_grammars():
    lark = _compile(grammar=(CASES / "grammars/xgrammar_lark_id_tag.lark").read_text())
    assert walk(lark, "id=42")[0] and walk(lark, "id=7 #ok\n")[0] and not walk(lark, "id=x")[0]
    ebnf = _compile(grammar=(CASES / "grammars/xgrammar_ebnf_id.ebnf").read_text())
    assert walk(ebnf, "id=42")[0] and not walk(ebnf, "id=x")[0]


@pytest.mark.parametrize("path", ["grammars/invalid_grammar.txt", "grammars/invalid_lark_missing_start.lark",
                                  "grammars/invalid_lark_single_quoted_literal.lark"])
def test_invalid_grammars_raise(path):
    with pytest.raises(ValueError, match="Failed to convert the grammar"):
        _compile(grammar=(CASES / path).read_text())


def test_structural_tag_compiles_and_holds():
    tag = (CASES / "structural_tag" / "legacy_structures_get_weather.json").read_text()
    matcher = _compile(structural_tag=tag).matcher()
    assert matcher.accept_bytes(b'ok <function=get_weather>{"city":"Oslo"}</function>')
    assert matcher.is_complete()


def test_min_max_length_50_accepts_exactly_50_characters():
    schema = json.loads((CASES / "schemas" / "min_max_length_50.json").read_text())
    compiled = _compile(json=schema)
    key = next(iter(schema.get("properties", {})), None)
    if key is None:
        assert walk(compiled, compact("x" * 50))[0]
        assert not walk(compiled, compact("x" * 49))[0]
