"""Errors raised while compiling a constraint. All are ``ValueError`` so callers that only
know vLLM's contract (``ValueError`` on a bad constraint) still catch them."""


class ConstraintError(ValueError):
    """A constraint that cannot be compiled; the message names the construct and how to fix it."""


class RegexError(ConstraintError):
    pass


class SchemaError(ConstraintError):
    """A JSON schema we cannot enforce; ``path`` is the JSON pointer of the offending keyword."""

    def __init__(self, message: str, path: str = "#"):
        super().__init__(f"{message} (at {path})")
        self.path = path


class GrammarError(ConstraintError):
    pass


class CompileTimeout(ConstraintError):
    pass
