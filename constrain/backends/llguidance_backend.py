"""llguidance as a structured-output backend (optional yardstick: ``pip install llguidance``).

Kinds: json / json_object (``grammar_from_json_schema``; ``disable_any_whitespace`` and
``whitespace_pattern`` map to its JSON options), regex, choice, grammar (GBNF or Lark, through
``llguidance.grammar_from``), as vLLM's guidance backend does. A compiled constraint is one
checked ``LLMatcher``; each request's matcher is a ``deep_copy`` of it.

llguidance stops by itself once nothing but EOS can follow and then refuses EOS; vLLM treats
EOS on a stopped matcher as accepted, and so does this adapter (``finished`` becomes True).
"""
from __future__ import annotations

from ..backend import Backend, Grammar, Matcher
from ..errors import ConstraintError
from ..matcher import decodable_prefix
from ..params import StructuredOutputsParams
from .common import clear_row, row_address, schema_of


class LLGuidanceBackend(Backend):
    name = "llguidance"

    def __init__(self, tokenizer, vocab_size: int, info):
        import llguidance
        import llguidance.hf
        self._llg = llguidance
        self.info = info
        self.eos_token_ids = tuple(info.eos_token_ids)
        self.tokenizer = llguidance.hf.from_tokenizer(
            tokenizer, n_vocab=vocab_size, eos_token=list(self.eos_token_ids))

    def grammar(self, params: StructuredOutputsParams) -> str:
        """The llguidance grammar text for ``params`` (not yet checked)."""
        llg, kind = self._llg, params.kind
        if kind in ("json", "json_object"):
            options = {"whitespace_flexible": not params.disable_any_whitespace}
            if params.whitespace_pattern is not None:
                options["whitespace_pattern"] = params.whitespace_pattern
            return llg.LLMatcher.grammar_from_json_schema(schema_of(params), defaults=options)
        if kind == "regex":
            return llg.grammar_from("regex", params.regex)
        if kind == "choice":
            return llg.grammar_from("choice", list(params.choice))
        if kind == "grammar":
            return llg.grammar_from("grammar", params.grammar)
        raise ConstraintError(f"structured_outputs.{kind} is not supported by the llguidance backend")

    def compile(self, params: StructuredOutputsParams) -> "LLGuidanceCompiled":
        params.validate()
        kind = params.kind
        try:
            grammar = self.grammar(params)
            template = self._llg.LLMatcher(self.tokenizer, grammar, log_level=0)
        except ConstraintError:
            raise
        except Exception as exc:       # ValueError for malformed input
            raise ConstraintError(f"llguidance cannot compile this {kind} constraint: {exc}") from None
        if template.is_error():
            message = template.get_error().strip().splitlines()
            raise ConstraintError(f"llguidance cannot compile this {kind} constraint: "
                                  f"{message[0] if message else 'unknown error'}")
        return LLGuidanceCompiled(template, self)


class LLGuidanceCompiled(Grammar):
    kind = "llguidance"

    def __init__(self, template, backend: LLGuidanceBackend):
        self.template = template
        self.backend = backend

    def matcher(self) -> "LLGuidanceMatcher":
        return LLGuidanceMatcher(self.template.deep_copy(), self.backend)


class LLGuidanceMatcher(Matcher):
    """The ``Matcher`` protocol over ``llguidance.LLMatcher``.

    ``_steps`` records, per accepted token, whether llguidance consumed it (False: an EOS
    accepted on a stopped matcher, which llguidance never saw) so ``rollback`` stays exact."""

    def __init__(self, matcher, backend: LLGuidanceBackend):
        self.m = matcher
        self.eos_token_ids = backend.eos_token_ids
        self.finished = False
        self._steps: list[bool] = []

    def fill_bitmask(self, bitmask, row: int) -> None:
        if self.finished:
            clear_row(bitmask, row)
            return
        address, size = row_address(bitmask, row)
        self.m.unsafe_compute_mask_ptr(address, size)

    def accept(self, token_id: int) -> bool:
        token_id = int(token_id)
        if self.finished:
            return False
        if token_id in self.eos_token_ids:
            if not self.m.is_accepting():
                return False
            consumed = not self.m.is_stopped() and self.m.try_consume_tokens([token_id]) == 1
            self._steps.append(consumed)
            self.finished = True
            return True
        if self.m.try_consume_tokens([token_id]) != 1:
            return False
        self._steps.append(True)
        return True

    def rollback(self, n: int) -> None:
        if n > len(self._steps):
            raise ValueError(f"cannot roll back {n} tokens: only {len(self._steps)} accepted")
        undone = [self._steps.pop() for _ in range(n)]
        if n:
            self.finished = False
        consumed = sum(undone)
        if consumed:
            self.m.rollback(consumed)

    def is_complete(self) -> bool:
        return self.m.is_accepting()

    def is_terminated(self) -> bool:
        return self.finished or (self.m.is_stopped() and self.m.is_accepting())

    def jump_forward(self) -> str | None:
        return decodable_prefix(bytes(self.m.compute_ff_bytes())[:256]) or None
