"""Shared helpers for the model-free conformance tests and bench/bench_structured.py:
where the external data lives, the SmolLM2 tokenizer info, and the token walk."""
from __future__ import annotations

import json
import os
import random
from functools import lru_cache
from pathlib import Path

import numpy as np

CONFORMANCE = Path(__file__).resolve().parents[1] / "data" / "conformance"
SUITE = CONFORMANCE / "json-schema-test-suite" / "tests" / "draft2020-12"
# The sample kept in the repository; TAMIS_MASKBENCH_DIR (or a benchmark's --data) points at
# the whole dev half (one folder per subset).
MASKBENCH = Path(os.environ.get("TAMIS_MASKBENCH_DIR") or CONFORMANCE / "maskbench-dev-sample")


@lru_cache(maxsize=1)
def smollm2():
    """(tokenizer, TokenizerInfo) of the embedded SmolLM2 model."""
    from transformers import AutoTokenizer

    from tamis.constrain import TokenizerInfo
    from tamis.engine.embedded import default_model_path
    tokenizer = AutoTokenizer.from_pretrained(default_model_path())
    return tokenizer, TokenizerInfo.from_hf(tokenizer)


def compact(data) -> str:
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


def in_schema_order(data, schema, root=None):
    """``data`` with each object's declared properties first, in the schema's order (the order
    tamis generates them in: a documented policy, as xgrammar's), other keys after in their
    own order. The value is unchanged, so validity is too: walking instances in this order
    measures whether every valid value can be generated, and that no invalid value can.
    Follows properties, additionalProperties, items, prefixItems, local $ref and the
    branches of allOf/anyOf/oneOf (the first branch declaring a key wins)."""
    root = schema if root is None else root
    schema = _resolve(schema, root)
    if not isinstance(schema, dict):
        return data
    if isinstance(data, dict):
        declared = _declared(schema, root)
        ordered = [k for k in declared if k in data] + [k for k in data if k not in declared]
        return {k: in_schema_order(data[k], _child(schema, root, k, declared), root) for k in ordered}
    if isinstance(data, list):
        prefix = schema.get("prefixItems") or (schema.get("items") if isinstance(schema.get("items"), list) else [])
        items = schema.get("items") if isinstance(schema.get("items"), dict) else {}
        return [in_schema_order(v, prefix[i] if i < len(prefix) else items, root) for i, v in enumerate(data)]
    return data


def _resolve(schema, root, depth=0):
    while isinstance(schema, dict) and isinstance(schema.get("$ref"), str) and \
            schema["$ref"].startswith("#") and depth < 32:
        target = root
        for part in schema["$ref"].lstrip("#").strip("/").split("/"):
            if part:
                target = target.get(part.replace("~1", "/").replace("~0", "~"), {}) \
                    if isinstance(target, dict) else {}
        schema, depth = target, depth + 1
    return schema


def _branches(schema, root):
    yield schema
    for key in ("allOf", "anyOf", "oneOf"):
        for branch in schema.get(key, []) or []:
            branch = _resolve(branch, root)
            if isinstance(branch, dict):
                yield from _branches(branch, root)


def _declared(schema, root) -> dict:
    """key -> its subschema, in declaration order over the schema and its branches; then the
    required keys no branch declares (tamis writes them after the declared ones, before
    additional ones), with None for a subschema."""
    declared = {}
    branches = list(_branches(schema, root))
    for branch in branches:
        for key, sub in (branch.get("properties") or {}).items():
            declared.setdefault(key, sub)
    for branch in branches:
        required = branch.get("required")
        for key in required if isinstance(required, list) else ():
            if isinstance(key, str):
                declared.setdefault(key, None)
    return declared


def _child(schema, root, key, declared):
    if declared.get(key) is not None:
        return declared[key]
    extra = schema.get("additionalProperties")
    return extra if isinstance(extra, dict) else {}


def walk(compiled, text: str, check_mask: bool = False) -> tuple[bool, int]:
    """Feeds ``text`` token by token, then EOS. Returns (accepted, tokens outside the mask)."""
    tokenizer, info = smollm2()
    matcher = compiled.matcher()
    bitmask = np.zeros((1, info.num_words), dtype=np.int32) if check_mask else None
    outside = 0
    for token in tokenizer.encode(text, add_special_tokens=False) + [info.eos_token_ids[0]]:
        if check_mask:
            matcher.fill_bitmask(bitmask, 0)
            outside += not (bitmask[0, token // 32] >> (token % 32)) & 1
        if not matcher.accept(token):
            return False, outside
    return True, outside


def maskbench_sample(per_subset: int = 40, seed: int = 0,
                     root: Path | None = None) -> list[tuple[str, Path]]:
    """The maskbench sample the tests and bench/bench_structured.py walk: up to ``per_subset``
    files per subset, sorted then shuffled with ``seed``. A subset folder with an
    ``ORDER.txt`` (the repository's sample) lists its files in the whole set's seed-0 order,
    so the same files come first either way."""
    out = []
    for subset in sorted(p for p in (root or MASKBENCH).iterdir() if p.is_dir()):
        order = subset / "ORDER.txt"
        if order.exists() and seed == 0:
            files = [subset / name for name in order.read_text().split()]
        else:
            files = sorted(subset.glob("*.json"))
            random.Random(seed).shuffle(files)
        out += [(subset.name, f) for f in files[:per_subset]]
    return out
