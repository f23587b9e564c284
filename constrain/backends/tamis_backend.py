"""tamis's own constraint compiler as a ``Backend`` (``compiler.compile_constraint``)."""
from __future__ import annotations

from ..backend import Backend, Grammar
from ..compiler import compile_constraint
from ..params import StructuredOutputsParams


class TamisBackend(Backend):
    name = "tamis"

    def __init__(self, info):
        self.info = info
        # The JSON-schema validator (enum values filtered against their sibling keywords) is
        # imported once with the backend, not inside the compile of the first request that
        # needs it: its imports take 40+ ms of CPU.
        import jsonschema  # noqa: F401

    def compile(self, params: StructuredOutputsParams) -> Grammar:
        return compile_constraint(params, self.info)
