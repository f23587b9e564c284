"""Beam search over the engine, with vLLM's API and transformers' algorithm.

    from tamis import LLM
    from tamis.engine.beam_search import BeamSearchParams
    out = LLM().beam_search(["The capital of France is"], BeamSearchParams(beam_width=4, max_tokens=16))
    best = out[0].sequences[0]          # tokens (prompt + output), text, cum_logprob, score

A search is driven from above the engine: every step, each live beam becomes one request
for one token with the top ``num_candidates`` logprobs, whose prompt is the search's prompt
plus the beam's tokens. The prefix cache (``enable_prefix_caching``, on by default) serves
every beam the prompt's full blocks and the full blocks of the prefix beams have in common,
so beams share those blocks (reference counted) and only compute their own tail; without
it every beam recomputes its whole sequence each step. Sharing through the cache needs no
fork of block tables in the engine, and a finished beam's blocks stay hittable for the
beams that continue it.

One step of ``BeamSearch.advance`` (k = beam_width, N = num_candidates)::

    candidates  = every live beam's top-N next tokens, scored by cum_logprob + logprob
    top N of them, best first:
        ends (EOS, stop string, or max_tokens reached) -> a hypothesis, if its rank < k;
                                                          score = cum_logprob / length**length_penalty
        otherwise                                      -> a live beam, until k are live
    hypotheses keep the k best scores; the search ends at max_tokens, when no beam is
    live, or when no live beam can still beat the worst of k hypotheses

This is transformers' beam search (``generate(num_beams=k, num_return_sequences=k,
do_sample=False, early_stopping="never", length_penalty=...)``): N = max(2, 1 + number of
EOS ids) * k, a hypothesis's length counts its output tokens including the EOS, the end
test is transformers' exact bound for ``early_stopping="never"``. Where vLLM differs, tamis
follows transformers: vLLM keeps every EOS candidate of a beam's top 2k (not only those
ranked among the first k), measures length including the prompt and excluding the EOS,
and always runs ``max_tokens`` steps. With a single EOS id and no EOS among the candidates
the two agree. ``temperature`` is accepted for vLLM's signature: scores are the model's
raw logprobs, so it changes nothing (in vLLM neither).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

from tamis.engine.outputs import Logprob
from tamis.engine.sampling_params import SamplingParams

TopLogprobs = dict[int, Logprob]


@dataclass
class BeamSearchParams:
    """vLLM's ``BeamSearchParams``; ``stop`` (strings that end a beam, as the server's
    ``stop``) is tamis's addition. Bad values raise ``ValueError`` naming the field."""
    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False
    stop: list[str] | None = None

    def __post_init__(self) -> None:
        for name in ("beam_width", "max_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer of at least 1, got {value!r}")
        if not isinstance(self.temperature, (int, float)) or not self.temperature >= 0.0:
            raise ValueError(f"temperature must be non-negative, got {self.temperature!r}")
        if not isinstance(self.length_penalty, (int, float)) or not math.isfinite(self.length_penalty):
            raise ValueError(f"length_penalty must be a finite number, got {self.length_penalty!r}")
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if any(not isinstance(s, str) or not s for s in stop):
            raise ValueError(f"stop must hold non-empty strings, got {self.stop!r}")
        self.stop = stop


@dataclass
class BeamSearchSequence:
    """One beam. ``tokens`` holds the prompt then the output (vLLM's layout), the output
    starting at ``num_prompt_tokens``; ``logprobs[i]`` is the candidate set the i-th output
    token was chosen from. ``score`` is what the search ranked it by."""
    tokens: list[int]
    num_prompt_tokens: int
    logprobs: list[TopLogprobs] = field(default_factory=list)
    cum_logprob: float = 0.0
    score: float = 0.0
    text: str | None = None
    finish_reason: str | None = None      # "stop" (EOS or a stop string) | "length"
    stop_reason: int | str | None = None  # the EOS id or stop string that ended it

    @property
    def output_token_ids(self) -> list[int]:
        return self.tokens[self.num_prompt_tokens:]


@dataclass
class BeamSearchOutput:
    """The best ``beam_width`` sequences of one prompt, best first."""
    sequences: list[BeamSearchSequence]


def num_candidates(params: BeamSearchParams, eos_token_ids: set[int]) -> int:
    """Candidates kept per step: enough that k beams stay live even if every beam's EOS
    ids rank first (transformers' count)."""
    num_eos = 0 if params.ignore_eos else len(eos_token_ids)
    return max(2, 1 + num_eos) * params.beam_width


def step_sampling_params(params: BeamSearchParams, eos_token_ids: set[int]) -> SamplingParams:
    """The request each live beam sends per step: one greedy token (ignored) and the top
    candidates' raw logprobs. EOS must not end it early: the search decides."""
    return SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True, detokenize=False,
                          logprobs=num_candidates(params, eos_token_ids))


class BeamSearch:
    """The search of one prompt, stepped by a driver (see the module docstring):

        while not search.done:
            search.advance([top_logprobs(tokens) for tokens in search.beams_to_score()])
        search.result()

    ``decode(token_ids) -> str`` is needed only for stop strings."""

    def __init__(self, prompt_token_ids: list[int], params: BeamSearchParams,
                 eos_token_ids: set[int], max_model_len: int,
                 decode: Callable[[list[int]], str] | None = None) -> None:
        if params.stop and decode is None:
            raise ValueError("stop strings need a tokenizer (the engine runs with skip_tokenizer_init)")
        self.params = params
        self.eos_token_ids = set() if params.ignore_eos else set(eos_token_ids)
        self.num_candidates = num_candidates(params, eos_token_ids)
        self.max_new_tokens = min(params.max_tokens, max_model_len - len(prompt_token_ids))
        if self.max_new_tokens < 1:
            raise ValueError(f"the prompt ({len(prompt_token_ids)} tokens) leaves no room in the "
                             f"maximum model length of {max_model_len} tokens")
        self.decode = decode
        self.num_generated = 0
        self.live = [BeamSearchSequence(list(prompt_token_ids), len(prompt_token_ids))]
        self.hypotheses: list[BeamSearchSequence] = []   # best first, at most beam_width
        self.done = False

    def beams_to_score(self) -> list[list[int]]:
        """The token lists whose next-token logprobs ``advance`` needs, in order."""
        return [] if self.done else [beam.tokens for beam in self.live]

    def advance(self, top_logprobs: list[TopLogprobs]) -> None:
        """One step, given each live beam's top candidates (token id -> Logprob)."""
        assert len(top_logprobs) == len(self.live) and not self.done
        k = self.params.beam_width
        self.num_generated += 1
        at_limit = self.num_generated >= self.max_new_tokens
        live = []
        for rank, (cum, beam, token, entry) in enumerate(self._best_candidates(top_logprobs)):
            sequence = self._extend(beam, token, entry, cum)
            if sequence.finish_reason is None and at_limit:
                sequence.finish_reason = "length"
            if sequence.finish_reason is not None:
                if rank < k:
                    self._add_hypothesis(sequence)
            elif len(live) < k:
                live.append(sequence)
        self.live = live
        self.done = at_limit or not live or not self._can_improve()

    def result(self) -> BeamSearchOutput:
        return BeamSearchOutput(list(self.hypotheses))

    def _best_candidates(self, top_logprobs: list[TopLogprobs]) -> list[tuple]:
        """The top N (cum_logprob, beam, token, entry) over all live beams, best first."""
        candidates = []
        for beam, entry in zip(self.live, top_logprobs):
            best = sorted(entry.items(), key=lambda item: -item[1].logprob)[:self.num_candidates]
            candidates += [(beam.cum_logprob + lp.logprob, beam, token, entry) for token, lp in best]
        candidates.sort(key=lambda c: -c[0])   # stable: ties keep beam order
        return candidates[:self.num_candidates]

    def _extend(self, beam: BeamSearchSequence, token: int, entry: TopLogprobs,
                cum_logprob: float) -> BeamSearchSequence:
        sequence = BeamSearchSequence(beam.tokens + [token], beam.num_prompt_tokens,
                                      beam.logprobs + [entry], cum_logprob)
        if token in self.eos_token_ids:
            sequence.finish_reason, sequence.stop_reason = "stop", token
        elif self.params.stop:
            text = self.decode(sequence.output_token_ids)
            hit = next((s for s in self.params.stop if s in text), None)
            if hit is not None:
                sequence.finish_reason, sequence.stop_reason = "stop", hit
        return sequence

    def _add_hypothesis(self, sequence: BeamSearchSequence) -> None:
        sequence.score = sequence.cum_logprob / self.num_generated ** self.params.length_penalty
        self.hypotheses.append(sequence)
        self.hypotheses.sort(key=lambda s: -s.score)
        del self.hypotheses[self.params.beam_width:]

    def _can_improve(self) -> bool:
        """Whether a live beam may still enter the k best hypotheses. A beam's cum_logprob
        only falls, so the best it can reach is its cum_logprob over the longest length
        when longer is better (length_penalty > 0), else over the current length."""
        if len(self.hypotheses) < self.params.beam_width:
            return True
        penalty = self.params.length_penalty
        length = self.max_new_tokens if penalty > 0 else self.num_generated
        best_possible = self.live[0].cum_logprob / length ** penalty
        return best_possible > self.hypotheses[-1].score


__all__ = ["BeamSearch", "BeamSearchOutput", "BeamSearchParams", "BeamSearchSequence",
           "num_candidates", "step_sampling_params"]
