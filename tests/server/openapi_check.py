"""Validate response bodies against OpenAI's OpenAPI subset in tests/data/conformance.

The spec is OpenAPI 3.1 but still marks some fields ``nullable: true`` (3.0 style),
which plain JSON Schema ignores; those are rewritten to also accept ``null``.
"""
from __future__ import annotations

import copy
import json
from functools import lru_cache
from pathlib import Path

import jsonschema

SPEC = (Path(__file__).resolve().parents[1] / "data" / "conformance" / "openai-openapi" /
        "openapi.subset-chat-completions-models.patched.json")


def _allow_null(node):
    if isinstance(node, list):
        return [_allow_null(x) for x in node]
    if not isinstance(node, dict):
        return node
    node = {k: _allow_null(v) for k, v in node.items()}
    if node.pop("nullable", False):
        if isinstance(node.get("enum"), list) and None not in node["enum"]:
            node["enum"] = [*node["enum"], None]
        if isinstance(node.get("type"), str):
            node["type"] = [node["type"], "null"]
        elif "type" not in node:
            node = {"anyOf": [node, {"type": "null"}]}
    return node


@lru_cache(maxsize=None)
def _components() -> dict:
    spec = json.loads(SPEC.read_text())
    return _allow_null(copy.deepcopy(spec["components"]))


def validate(instance, schema_name: str) -> None:
    """Raises ``jsonschema.ValidationError`` if ``instance`` is not a ``schema_name``."""
    schema = {"$ref": f"#/components/schemas/{schema_name}", "components": _components()}
    jsonschema.Draft202012Validator(schema).validate(instance)
