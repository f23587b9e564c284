"""``StructuredOutputsParams``: the request surface, field for field vLLM's.

Exactly one of ``choice``, ``regex``, ``json``, ``grammar``, ``json_object``,
``structural_tag`` must be set. ``json`` may be a dict, a JSON string or a pydantic model
class (converted with ``model_json_schema()``). ``validate()`` is the cheap syntax check the
engine runs in ``add_request``; full compilation happens later in the compile pool.
"""
from __future__ import annotations

import json as _json
from dataclasses import dataclass, fields
from typing import Any

_CONSTRAINT_FIELDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")


@dataclass
class StructuredOutputsParams:
    json: str | dict | Any | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None
    structural_tag: str | dict | None = None   # tamis.constrain.structural_tag

    def __post_init__(self):
        if self.json is not None and not isinstance(self.json, (str, dict, bool)):
            if hasattr(self.json, "model_json_schema"):
                self.json = self.json.model_json_schema()
            else:
                raise ValueError("json must be a JSON schema as a dict or string, or a pydantic "
                                 f"model class; got {type(self.json).__name__}")
        if self.json_object is False:
            self.json_object = None
        count = sum(getattr(self, name) is not None for name in _CONSTRAINT_FIELDS)
        if count > 1:
            raise ValueError("You can only use one kind of structured outputs constraint "
                             f"but multiple are specified: {self.__dict__}")
        if count == 0:
            raise ValueError("You must use one kind of structured outputs constraint but none "
                             f"is specified (one of {', '.join(_CONSTRAINT_FIELDS)}): {self.__dict__}")

    # ---- what the compiler keys on -------------------------------------------------------
    @property
    def kind(self) -> str:
        for name in _CONSTRAINT_FIELDS:
            if getattr(self, name) is not None:
                return name
        raise AssertionError("validated in __post_init__")

    def spec_key(self) -> tuple:
        """Hashable identity of the constraint and its options (the compile-cache key)."""
        value = getattr(self, self.kind)
        if isinstance(value, dict):
            value = _json.dumps(value, sort_keys=True)
        elif isinstance(value, list):
            value = tuple(value)
        return (self.kind, value, self.disable_any_whitespace,
                self.disable_additional_properties, self.whitespace_pattern)

    def validate(self) -> None:
        """Cheap checks for ``add_request``: types, JSON syntax, non-empty choice; raises ValueError."""
        if self.structural_tag is not None:
            from .structural_tag import parse_structural_tag
            parse_structural_tag(self.structural_tag)   # ConstraintError (a ValueError) naming it
        if self.choice is not None:
            if not isinstance(self.choice, (list, tuple)) or not self.choice:
                raise ValueError("structured_outputs.choice must be a non-empty list of strings")
            if not all(isinstance(c, str) for c in self.choice):
                raise ValueError("structured_outputs.choice must contain only strings")
        if self.regex is not None and not isinstance(self.regex, str):
            raise ValueError("structured_outputs.regex must be a string")
        if self.grammar is not None and (not isinstance(self.grammar, str) or not self.grammar.strip()):
            raise ValueError("structured_outputs.grammar must be a non-empty string")
        if isinstance(self.json, str):
            try:
                _json.loads(self.json)
            except ValueError as exc:
                raise ValueError(f"structured_outputs.json is not valid JSON: {exc}") from None
        if self.whitespace_pattern is not None and not isinstance(self.whitespace_pattern, str):
            raise ValueError("structured_outputs.whitespace_pattern must be a regex string")

    @classmethod
    def from_dict(cls, data: dict) -> "StructuredOutputsParams":
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown structured_outputs field(s): {sorted(unknown)}")
        return cls(**data)
