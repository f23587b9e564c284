"""tamis's own constraint compiler as a backend object (the interface the others follow)."""
from __future__ import annotations

from ..compiler import compile_constraint
from ..params import StructuredOutputsParams


class TamisBackend:
    name = "tamis"

    def __init__(self, info):
        self.info = info

    def compile(self, params: StructuredOutputsParams):
        """Compiled constraint with ``matcher()``; ``ConstraintError`` if it cannot be compiled."""
        return compile_constraint(params, self.info)
