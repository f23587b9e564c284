"""tamis.constrain: structured outputs (choice, regex, JSON schema, Lark and GBNF grammars)
compiled into per-request matchers that fill token bitmasks. See constrain/README.md."""
from .backend import Backend, Grammar, Matcher
from .compiler import ConstraintCompiler, compile_constraint
from .errors import CompileTimeout, ConstraintError, GrammarError, RegexError, SchemaError
from .params import StructuredOutputsParams
from .tokenizer_info import TokenizerInfo

__all__ = [
    "StructuredOutputsParams", "TokenizerInfo", "Backend", "Grammar", "Matcher",
    "ConstraintCompiler", "compile_constraint",
    "ConstraintError", "SchemaError", "RegexError", "GrammarError", "CompileTimeout",
]
