"""``uniqueItems`` over strings of unbounded length (``unique_items``): a repeated string item
is refused, compared as decoded JSON, wherever a subschema that may apply asks for it; masks
agree with ``accept`` and never empty; other schemas still refuse it (structural tags)."""
import itertools
import json
import random

import jsonschema
import numpy as np
import pytest

from conformance import compact, smollm2, walk
from tamis.constrain import SchemaError, StructuredOutputsParams, compile_constraint
from tamis.constrain.unique_items import CompiledUniqueItems

TAGS = {"type": "array", "uniqueItems": True, "items": {"type": "string"}}


def _compiled(schema):
    return compile_constraint(StructuredOutputsParams(json=schema), smollm2()[1])


def test_arrays_of_strings_accepted_exactly_when_valid():
    compiled = _compiled(TAGS)
    assert isinstance(compiled, CompiledUniqueItems)
    validator = jsonschema.Draft202012Validator(TAGS)
    pool = ["a", "b", "ab", "", " a", "a\\"]
    arrays = [list(a) for size in range(4) for a in itertools.product(pool, repeat=size)]
    wrong = [a for a in arrays if walk(compiled, compact(a))[0] != validator.is_valid(a)]
    assert not wrong, wrong[:5]


@pytest.mark.parametrize("text, valid", [
    ('["A","\\u0041"]', False),          # equal once decoded
    ('["\\"","\\u0022"]', False),
    ('["a\\\\","a\\\\\\\\"]', True),       # a\\ and a\\\\: different
    ('["x", "y" , "x"]', False),          # whitespace between items
])
def test_items_compare_as_decoded_strings(text, valid):
    assert walk(_compiled(TAGS), text)[0] is valid


def test_where_the_schema_asks_and_only_there():
    schema = {"type": "object", "properties": {
        "tags": {"$ref": "#/$defs/tags"},
        "free": {"type": "array", "items": {"type": "string"}},
        "nested": {"type": "array", "items": {"$ref": "#/$defs/tags"}},
        "either": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/tags"}]},
        "by_pattern": {"type": "object", "patternProperties": {"^u_": {"$ref": "#/$defs/tags"}}}},
        "$defs": {"tags": TAGS}}
    compiled = _compiled(schema)
    assert walk(compiled, '{"tags":["a","b"],"free":["a","a"],"nested":[["a"],["a"]]}')[0]
    assert not walk(compiled, '{"tags":["a","a"]}')[0]
    assert not walk(compiled, '{"nested":[["a","b"],["c","c"]]}')[0]
    assert not walk(compiled, '{"either":["b","b"]}')[0]
    assert walk(compiled, '{"by_pattern":{"v_":["q","q"],"u_":["q","r"]}}')[0]
    assert not walk(compiled, '{"by_pattern":{"u_":["q","q"]}}')[0]


def test_masks_agree_with_accept_and_never_empty():
    """Token by token, preferring tokens that would repeat an item (a quote, "a"): every
    output that ends is valid, the mask always leaves a token, and each masked-out token is
    one ``accept`` refuses."""
    schema = {"type": "array", "uniqueItems": True, "minItems": 4, "maxItems": 6, "items": TAGS["items"]}
    compiled = _compiled(schema)
    tokenizer, info = smollm2()
    eager = [tokenizer.convert_tokens_to_ids(t) for t in ['"', 'a', '","', '"]', ',', '""', '["', '"a']]
    eager = [t for t in eager if t is not None and t >= 0]
    validator = jsonschema.Draft202012Validator(schema)
    rng = random.Random(0)
    for _ in range(12):
        matcher = compiled.matcher()
        bitmask = np.zeros((1, info.num_words), dtype=np.int32)
        out = b""
        for _ in range(60):
            matcher.fill_bitmask(bitmask, 0)
            allowed = np.flatnonzero(np.unpackbits(bitmask[0].view(np.uint8), bitorder="little")[:info.vocab_size])
            assert len(allowed), out
            preferred = [t for t in eager if t in set(allowed.tolist())]
            refused = [t for t in eager if t not in set(allowed.tolist())]
            for token in refused:                     # masked out: accept agrees
                if matcher.accept(token):
                    matcher.rollback(1)
                    assert token in info.eos_token_ids or not _repeats(out + info.token_bytes[token]), \
                        (out, info.token_bytes[token])
            token = rng.choice(preferred) if preferred and rng.random() < 0.8 else int(rng.choice(allowed))
            assert matcher.accept(token)
            if token in info.eos_token_ids:
                assert validator.is_valid(json.loads(out)), out
                break
            out += info.token_bytes[token]


def _repeats(prefix: bytes) -> bool:
    """Whether the closed string items of the array text ``prefix`` hold a repeat."""
    text = prefix.decode("utf-8", "replace")
    for end in range(len(text), 0, -1):
        try:
            items = json.loads(text[:end].rstrip(", \n") + "]")
        except ValueError:
            continue
        return len(set(items)) < len(items)
    return False


def test_rollback_restores_the_items_seen():
    matcher = _compiled(TAGS).matcher()
    assert matcher.accept_bytes(b'["a",')
    assert matcher.accept_bytes(b'"b"')
    matcher.rollback(1)
    assert matcher.accept_bytes(b'"b"')
    assert not matcher.accept_bytes(b',"a"')
    assert matcher.accept_bytes(b',"c"]')
    assert matcher.is_complete()


def test_structural_tag_schemas_still_refuse_it():
    tag = {"type": "structural_tag", "structures": [{"begin": "<f>", "schema": TAGS, "end": "</f>"}],
           "triggers": ["<f>"]}
    with pytest.raises(SchemaError, match="uniqueItems"):
        compile_constraint(StructuredOutputsParams(structural_tag=json.dumps(tag)), smollm2()[1])
