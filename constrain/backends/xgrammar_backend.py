"""xgrammar as a structured-output backend (optional yardstick: ``pip install xgrammar``).

Kinds: json / json_object (``compile_json_schema``), regex, choice (an EBNF alternation),
grammar (GBNF/EBNF when a line has ``::=``, as in vLLM; otherwise Lark via ``compile_lark``).
Semantics follow tamis's where xgrammar lets us choose: additional properties are allowed
unless ``disable_additional_properties`` (xgrammar ``strict_mode``), and
``disable_any_whitespace`` means compact separators ``,`` and ``:``.
``whitespace_pattern`` has no xgrammar equivalent and is refused with ``ConstraintError``.
"""
from __future__ import annotations

import json
import re

from ..backend import Backend, Grammar, Matcher
from ..errors import ConstraintError
from ..gbnf import is_gbnf
from ..params import StructuredOutputsParams
from .common import clear_row, schema_of


class XGrammarBackend(Backend):
    name = "xgrammar"

    def __init__(self, tokenizer, vocab_size: int, info, max_threads: int = 1):
        import xgrammar as xgr
        self._xgr = xgr
        self.info = info
        self.eos_token_ids = tuple(info.eos_token_ids)
        self.tokenizer_info = xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=list(self.eos_token_ids))
        # xgrammar's own cache is off: the ConstraintCompiler around us caches, and the bench
        # measures cold compiles.
        self.compiler = xgr.GrammarCompiler(self.tokenizer_info, max_threads=max_threads,
                                            cache_enabled=False)

    def compile(self, params: StructuredOutputsParams) -> "XGrammarCompiled":
        params.validate()
        kind = params.kind
        try:
            compiled = self._compile(params, kind)
        except ConstraintError:
            raise
        except Exception as exc:      # xgrammar raises RuntimeError / InvalidJSONError
            lines = str(exc).strip().splitlines()
            # drop xgrammar's "[hh:mm:ss] /project/cpp/file.cc:NN: " prefix
            message = re.sub(r"^\[[0-9:]+\] \S+:\d+: ", "", lines[-1]) if lines else type(exc).__name__
            raise ConstraintError(f"xgrammar cannot compile this {kind} constraint: {message}") from None
        return XGrammarCompiled(compiled, self)

    def _compile(self, params: StructuredOutputsParams, kind: str):
        if params.whitespace_pattern is not None and kind in ("json", "json_object"):
            raise ConstraintError("xgrammar does not support structured_outputs.whitespace_pattern; "
                                  "use the 'tamis' or 'llguidance' backend")
        if kind in ("json", "json_object"):
            compact = params.disable_any_whitespace
            return self.compiler.compile_json_schema(
                json.dumps(schema_of(params)), any_whitespace=not compact,
                separators=(",", ":") if compact else None,
                strict_mode=bool(params.disable_additional_properties))
        if kind == "regex":
            return self.compiler.compile_regex(params.regex)
        if kind == "choice":
            alternatives = " | ".join(json.dumps(c, ensure_ascii=False) for c in params.choice)
            return self.compiler.compile_grammar(f"root ::= {alternatives}")
        if kind == "grammar":
            if is_gbnf(params.grammar):
                return self.compiler.compile_grammar(params.grammar)
            return self.compiler.compile_lark(params.grammar)
        raise ConstraintError(f"structured_outputs.{kind} is not supported by the xgrammar backend")


class XGrammarCompiled(Grammar):
    kind = "xgrammar"

    def __init__(self, compiled, backend: XGrammarBackend):
        self.compiled = compiled
        self.backend = backend

    def matcher(self) -> "XGrammarMatcher":
        return XGrammarMatcher(self.backend._xgr.GrammarMatcher(self.compiled), self.backend)


class XGrammarMatcher(Matcher):
    """The ``Matcher`` protocol over ``xgrammar.GrammarMatcher`` (EOS = the stop token)."""

    def __init__(self, matcher, backend: XGrammarBackend):
        self.m = matcher
        self.eos_token_ids = backend.eos_token_ids
        self.num_words = backend.info.num_words

    @property
    def finished(self) -> bool:
        """EOS accepted."""
        return self.m.is_terminated()

    def fill_bitmask(self, bitmask, row: int) -> None:
        if self.m.is_terminated():
            clear_row(bitmask, row)
        else:
            self.m.fill_next_token_bitmask(bitmask, row)

    def accept(self, token_id: int) -> bool:
        return bool(self.m.accept_token(int(token_id)))

    def rollback(self, n: int) -> None:
        if n:
            self.m.rollback(n)

    def is_complete(self) -> bool:
        return self.m.is_completed()

    def is_terminated(self) -> bool:
        if self.m.is_terminated():
            return True
        return self.m.is_completed() and self._only_eos_allowed()

    def _only_eos_allowed(self) -> bool:
        import numpy as np
        row = np.zeros((1, self.num_words), dtype=np.int32)
        self.m.fill_next_token_bitmask(row, 0)
        allowed = np.unpackbits(row.view(np.uint8), bitorder="little")
        allowed[list(self.eos_token_ids)] = 0
        return not allowed.any()

    def jump_forward(self) -> str | None:
        return self.m.find_jump_forward_string() or None
