"""vLLM's ``structural_tag``: free text in which every trigger opens a tagged section.

Both of xgrammar's spellings are accepted, as a JSON string or a dict::

    {"type": "structural_tag", "triggers": [...],
     "structures": [{"begin": ..., "schema": {JSON schema}, "end": ...}, ...]}
    {"type": "structural_tag", "format": {"type": "triggered_tags", "triggers": [...],
     "tags": [{"begin": ..., "content": {"type": "json_schema", "json_schema": {...}}
                                     or {"type": "any_text"}, "end": ...}, ...],
     "stop_after_first": false, "at_least_one": false}}

The language: ``TEXT (TAG TEXT)*``, where TEXT holds no trigger and each TAG is
``begin content end`` with a ``begin`` that starts with a trigger. JSON content follows its
schema (whitespace as for ``json``); ``any_text`` content is any text without ``end``.
``stop_after_first``: the output ends after its first tag; ``at_least_one``: it holds one.
Everything else is refused naming the field.
"""
from __future__ import annotations

import json

from . import regex_ast as ra
from .errors import ConstraintError
from .json_schema import compile_json_schema
from .regex_parser import ANY

ANY_TEXT = ra.rep(ra.chars(ANY), 0, None)


def parse_structural_tag(spec) -> dict:
    """The spec as a dict in the "format" spelling; ConstraintError naming what is wrong."""
    if isinstance(spec, str):
        try:
            spec = json.loads(spec)
        except ValueError as exc:
            raise ConstraintError(f"structured_outputs.structural_tag is not valid JSON: {exc}") from None
    if not isinstance(spec, dict) or spec.get("type", "structural_tag") != "structural_tag":
        raise ConstraintError('structured_outputs.structural_tag must be an object of '
                              '"type": "structural_tag"')
    if "format" in spec:
        fmt = spec["format"]
        if not isinstance(fmt, dict) or fmt.get("type") != "triggered_tags":
            raise ConstraintError("structural_tag.format: only the \"triggered_tags\" format is "
                                  "supported")
    else:
        structures = _list(spec, "structures", "structural_tag")
        fmt = {"type": "triggered_tags", "triggers": spec.get("triggers"),
               "tags": [{"begin": s.get("begin"), "end": s.get("end"),
                         "content": {"type": "json_schema", "json_schema": s.get("schema")}}
                        for s in structures if isinstance(s, dict)]}
        if len(fmt["tags"]) != len(structures):
            raise ConstraintError("structural_tag.structures must hold objects")
    return fmt


def compile_structural_tag(spec, whitespace: str | None) -> tuple[tuple, dict]:
    """(root node, rules) of the structural tag ``spec`` (rules: its JSON schemas' own)."""
    fmt = parse_structural_tag(spec)
    triggers = [t for t in _list(fmt, "triggers", "structural_tag.format")]
    if not triggers or not all(isinstance(t, str) and t for t in triggers):
        raise ConstraintError("structural_tag.triggers must be non-empty strings")
    rules: dict = {}
    tags = []
    for index, tag in enumerate(_list(fmt, "tags", "structural_tag.format")):
        tags.append(_tag(tag, index, triggers, whitespace, rules))
    if not tags:
        raise ConstraintError("structural_tag.tags must hold at least one tag")
    text = ("diff", ANY_TEXT, ra.seq(ANY_TEXT, ra.alt(*map(ra.literal, triggers)), ANY_TEXT))
    tag = ra.alt(*tags)
    if fmt.get("stop_after_first"):
        body = ra.seq(text, tag if fmt.get("at_least_one") else ra.opt(tag))
    elif fmt.get("at_least_one"):
        body = ra.seq(text, tag, text, ra.rep(ra.seq(tag, text), 0, None))
    else:
        body = ra.seq(text, ra.rep(ra.seq(tag, text), 0, None))
    return body, rules


def _tag(tag, index: int, triggers: list[str], whitespace, rules: dict) -> tuple:
    where = f"structural_tag.tags[{index}]"
    if not isinstance(tag, dict):
        raise ConstraintError(f"{where} must be an object")
    begin, end = tag.get("begin"), tag.get("end")
    if not isinstance(begin, str) or not isinstance(end, str) or not begin:
        raise ConstraintError(f"{where}: begin (non-empty) and end must be strings")
    if not any(begin.startswith(t) for t in triggers):
        raise ConstraintError(f"{where}: begin {begin!r} starts with none of the triggers")
    content = tag.get("content")
    kind = content.get("type") if isinstance(content, dict) else None
    if kind == "any_text":
        inner = ("diff", ANY_TEXT, ra.seq(ANY_TEXT, ra.literal(end), ANY_TEXT)) if end else ANY_TEXT
    elif kind == "json_schema":
        node, own = compile_json_schema(content.get("json_schema"), whitespace)
        inner = node
        if own:   # each tag's schema has its own rules: their names get the tag's prefix
            memo: dict = {}
            inner = _renamed(node, f"tag{index}:", memo)
            rules.update({f"tag{index}:{name}": _renamed(rule, f"tag{index}:", memo)
                          for name, rule in own.items()})
    else:
        raise ConstraintError(f"{where}.content: type must be \"json_schema\" or \"any_text\", "
                              f"got {kind!r}")
    return ra.seq(ra.literal(begin), inner, ra.literal(end) if end else ra.EMPTY)


def _renamed(node, prefix: str, memo: dict):
    """``node`` with every rule reference prefixed; shared sub-nodes renamed once."""
    if not isinstance(node, (tuple, list)):
        return node
    found = memo.get(id(node))
    if found is not None:
        return found[1]
    if isinstance(node, tuple) and len(node) == 2 and node[0] == "rule":
        out = ("rule", prefix + node[1])
    else:
        out = type(node)(_renamed(part, prefix, memo) for part in node)
    memo[id(node)] = (node, out)
    return out


def _list(spec: dict, key: str, where: str) -> list:
    value = spec.get(key)
    if not isinstance(value, list):
        raise ConstraintError(f"{where}.{key} must be a list")
    return value
