"""Per-request generation parameters, with vLLM's names, defaults and validation.

``SamplingParams()`` samples at temperature 1.0 for 16 tokens, like vLLM. A temperature
of 0 means greedy (top-p/top-k/min-p are then reset, seed is ignored). ``top_k`` of 0
or -1 disables top-k. Invalid values raise ``ValueError`` naming the field. Checks that
need the model (vocabulary size for ``logit_bias`` / ``allowed_token_ids``,
``max_logprobs``) happen in ``LLMEngine.add_request``, which also turns ``bad_words`` into
token sequences (``update_from_tokenizer``).

Size caps against hostile requests: at most ``MAX_STOP_STRINGS`` stop strings and
``MAX_LOGIT_BIAS_ENTRIES`` logit_bias entries (vLLM's GPU sampler's bound).
"""
from __future__ import annotations

import copy
import enum
import os
from dataclasses import dataclass, field
from typing import Any

SAMPLING_EPS = 1e-5   # temperatures below this are greedy (vLLM's _SAMPLING_EPS)
# vLLM sets no bound on stop strings; each one is searched for after every token, so a
# request may not hold more than this (OpenAI's API allows 4).
MAX_STOP_STRINGS = 128
MAX_LOGIT_BIAS_ENTRIES = 1024   # vLLM's MAX_NUM_LOGIT_BIAS_TOKENS


class RequestOutputKind(enum.Enum):
    CUMULATIVE = 0   # every output holds everything so far
    DELTA = 1        # every output holds only what is new (streaming servers)
    FINAL_ONLY = 2   # only the finished output is returned


class SamplingType(enum.IntEnum):
    GREEDY = 0
    RANDOM = 1
    RANDOM_SEED = 2


@dataclass
class SamplingParams:
    n: int = 1
    best_of: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    max_tokens: int | None = 16
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    detokenize: bool = True
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    truncate_prompt_tokens: int | None = None
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    structured_outputs: Any = None   # tamis.constrain.StructuredOutputsParams
    extra_args: dict[str, Any] | None = None
    # Filled by the engine: EOS ids (unless ignore_eos) plus stop_token_ids.
    all_stop_token_ids: set[int] = field(default_factory=set, repr=False)
    # Filled by the engine from ``bad_words`` (``update_from_tokenizer``).
    bad_words_token_ids: list[list[int]] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        self._normalize()
        self._verify_args()
        if self.temperature < SAMPLING_EPS:
            # Greedy: the filters change nothing, reset them so batching can skip them.
            self.top_p, self.top_k, self.min_p = 1.0, 0, 0.0
        self.all_stop_token_ids = set(self.stop_token_ids)

    def _normalize(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        if isinstance(self.bad_words, str):
            self.bad_words = [self.bad_words]
        self.bad_words = list(self.bad_words or [])
        if self.top_k == -1:
            self.top_k = 0
        if self.logit_bias is not None:
            try:
                self.logit_bias = {int(k): float(v) for k, v in self.logit_bias.items()}
            except (TypeError, ValueError, AttributeError) as exc:
                raise ValueError(f"logit_bias must map token ids to floats: {exc}") from None

    def _verify_args(self) -> None:
        _check_int("n", self.n, minimum=1)
        max_n = _max_n_sequences()
        if self.n > max_n:
            raise ValueError(f"n must be at most {max_n}, got {self.n} (TAMIS_MAX_N_SEQUENCES "
                             f"raises the limit)")
        if self.best_of is not None and self.best_of != self.n:
            raise ValueError(f"best_of is not supported (it must be unset or equal n={self.n}), "
                             f"got {self.best_of}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not -2.0 <= value <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2], got {value}")
        if not self.repetition_penalty > 0.0:
            raise ValueError(f"repetition_penalty must be greater than zero, got {self.repetition_penalty}")
        if not self.temperature >= 0.0:
            raise ValueError(f"temperature must be non-negative, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        _check_int("top_k", self.top_k, minimum=0, hint="0 or -1 disables top-k")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.seed is not None:
            _check_int("seed", self.seed, minimum=None)
            if not -2**63 <= self.seed < 2**63:   # vLLM's bound: a 64-bit signed integer
                raise ValueError(f"seed must be a 64-bit signed integer, got {self.seed}")
        if len(self.logit_bias or ()) > MAX_LOGIT_BIAS_ENTRIES:
            raise ValueError(f"logit_bias holds {len(self.logit_bias)} entries; at most "
                             f"{MAX_LOGIT_BIAS_ENTRIES} are allowed")
        for token, bias in (self.logit_bias or {}).items():
            if not -100.0 <= bias <= 100.0:   # OpenAI's bound
                raise ValueError(f"logit_bias values must be in [-100, 100], got {bias} for "
                                 f"token {token}")
        if self.max_tokens is not None:
            _check_int("max_tokens", self.max_tokens, minimum=1)
        _check_int("min_tokens", self.min_tokens, minimum=0)
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens must be less than or equal to max_tokens="
                             f"{self.max_tokens}, got {self.min_tokens}")
        self._verify_logprobs_and_stops()

    def _verify_logprobs_and_stops(self) -> None:
        if self.logprobs is not None:
            _check_int("logprobs", self.logprobs, minimum=-1, hint="-1 = whole vocabulary")
        if self.prompt_logprobs is not None:
            _check_int("prompt_logprobs", self.prompt_logprobs, minimum=-1,
                       hint="-1 = whole vocabulary")
        if self.truncate_prompt_tokens is not None:
            _check_int("truncate_prompt_tokens", self.truncate_prompt_tokens, minimum=1)
        if any(not isinstance(s, str) or s == "" for s in self.stop):
            raise ValueError(f"stop must hold non-empty strings, got {self.stop!r}")
        if len(self.stop) > MAX_STOP_STRINGS:
            raise ValueError(f"stop holds {len(self.stop)} strings; at most {MAX_STOP_STRINGS} "
                             f"are allowed")
        if any(not isinstance(w, str) or not w.strip() for w in self.bad_words):
            raise ValueError(f"bad_words must hold non-empty strings, got {self.bad_words!r}")
        if self.stop and not self.detokenize:
            raise ValueError("stop strings are only supported when detokenize is True")
        for token_id in self.stop_token_ids:
            _check_int("stop_token_ids", token_id, minimum=0)
        if self.allowed_token_ids is not None:
            if len(self.allowed_token_ids) == 0:
                raise ValueError("allowed_token_ids must not be empty (None allows every token)")
            for token_id in self.allowed_token_ids:
                _check_int("allowed_token_ids", token_id, minimum=0)
        if not isinstance(self.output_kind, RequestOutputKind):
            raise ValueError(f"output_kind must be a RequestOutputKind, got {self.output_kind!r}")

    def update_from_tokenizer(self, tokenizer, vocab_size: int | None = None) -> None:
        """Fills ``bad_words_token_ids``: each bad word as it is tokenized at the start of a
        text and, when that gives a different first token of the same length, after a space
        (as vLLM does, so a word is banned both at the start and inside the text).
        ValueError when a token falls outside the model's ``vocab_size``."""
        self.bad_words_token_ids = []
        for word in self.bad_words:
            bare = tokenizer.encode(word.lstrip(), add_special_tokens=False)
            spaced = tokenizer.encode(" " + word.lstrip(), add_special_tokens=False)
            self.bad_words_token_ids.append(bare)
            if spaced[0] != bare[0] and len(spaced) == len(bare):
                self.bad_words_token_ids.append(spaced)
        outside = [t for word in self.bad_words_token_ids for t in word
                   if vocab_size is not None and not 0 <= t < vocab_size]
        if outside:
            raise ValueError(f"bad_words tokenize to ids outside the model's vocabulary "
                             f"(valid ids: 0..{vocab_size - 1}): {outside[:5]}")

    @property
    def sampling_type(self) -> SamplingType:
        if self.temperature < SAMPLING_EPS:
            return SamplingType.GREEDY
        return SamplingType.RANDOM_SEED if self.seed is not None else SamplingType.RANDOM

    def clone(self) -> "SamplingParams":
        """A deep copy, except the (immutable, possibly large) structured-output spec."""
        spec, self.structured_outputs = self.structured_outputs, None
        try:
            twin = copy.deepcopy(self)
        finally:
            self.structured_outputs = spec
        twin.structured_outputs = spec
        return twin


def _max_n_sequences() -> int:
    """The most sequences one request may ask for: vLLM's default, 16,384, or
    ``TAMIS_MAX_N_SEQUENCES``."""
    return int(os.environ.get("TAMIS_MAX_N_SEQUENCES", "16384"))


def _check_int(name: str, value: Any, minimum: int | None, hint: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        extra = f" ({hint})" if hint else ""
        raise ValueError(f"{name} must be at least {minimum}{extra}, got {value}")


__all__ = ["SamplingParams", "RequestOutputKind", "SamplingType", "SAMPLING_EPS", "MAX_STOP_STRINGS",
           "MAX_LOGIT_BIAS_ENTRIES"]
