"""``use_beam_search: true`` on /v1/completions and /v1/chat/completions, as vLLM serves it.

``n`` is the beam width and the number of choices (best first); ``max_tokens``,
``length_penalty``, ``stop``, ``include_stop_str_in_output``, ``ignore_eos``, ``logprobs``
and ``echo`` apply; the search is ``tamis.engine.beam_search``'s (transformers' algorithm)
over the running engine, each step one request per live beam. Refused with a 400 naming
the field: ``stream`` (vLLM's completions refuse it too; its chat sends the finished
result as one chunk), structured outputs / ``response_format`` / tools, ``best_of``
(vLLM 0.26 has no such field), ``cache_salt``, ``prompt_logprobs``, and every
sampling-only field set to a non-default value (penalties, top-k/p, min-p,
``logit_bias``...), which beam search would otherwise ignore.
"""
from __future__ import annotations

import asyncio

from tamis.engine.beam_search import (BeamSearch, BeamSearchParams, BeamSearchSequence,
                                      step_sampling_params)
from tamis.engine.outputs import CompletionOutput, RequestOutput
from tamis.server.errors import invalid

# Fields beam search does not serve, and the values that mean "unset".
_NOT_WITH_BEAMS = {"top_p": (None, 1.0), "top_k": (None, 0, -1), "min_p": (None, 0.0),
                  "presence_penalty": (None, 0.0), "frequency_penalty": (None, 0.0),
                  "repetition_penalty": (None, 1.0), "logit_bias": (None, {}),
                  "allowed_token_ids": (None,), "bad_words": (None, []),
                  "stop_token_ids": (None, []), "min_tokens": (0,),
                  "prompt_logprobs": (None,), "structured_outputs": (None,),
                  "response_format": (None,), "tools": (None, []), "cache_salt": (None,)}


def check_beam_request(body, constraint) -> None:
    """400 naming the first field beam search cannot honour (module docstring)."""
    if body.stream:
        raise invalid("streaming is not supported with beam search (use_beam_search); "
                      "send stream: false", "stream")
    if body.best_of is not None and body.best_of != body.n:
        raise invalid(f"best_of is not supported: with use_beam_search, n={body.n} is the "
                      f"beam width and the number of choices", "best_of")
    for name, unset in _NOT_WITH_BEAMS.items():
        if getattr(body, name, None) not in unset:
            raise invalid(f"{name} is not supported with beam search (use_beam_search); "
                          f"leave it unset", name)
    if constraint is not None:
        raise invalid("structured outputs are not supported with beam search "
                      "(use_beam_search)", "structured_outputs")


def beam_search_params(body, max_tokens: int) -> BeamSearchParams:
    stop = [body.stop] if isinstance(body.stop, str) else body.stop
    try:
        return BeamSearchParams(beam_width=body.n, max_tokens=max_tokens, ignore_eos=body.ignore_eos,
                                temperature=body.temperature if body.temperature is not None else 1.0,
                                length_penalty=body.length_penalty,
                                include_stop_str_in_output=body.include_stop_str_in_output,
                                stop=stop)
    except ValueError as exc:
        message = str(exc)
        field = next((name for name in ("max_tokens", "temperature", "length_penalty", "stop")
                      if message.startswith(name)), "n")
        raise invalid(message.replace("beam_width", "n (the beam width)"), field) from exc


async def beam_search_outputs(ctx, body, jobs: list[tuple[list[int], int]], request_id: str,
                              num_logprobs: int | None, constraint) -> list[RequestOutput]:
    """One finished ``RequestOutput`` per (prompt ids, max_tokens) job, its ``n`` choices
    the best beams, best first. ``num_logprobs``: top logprobs each choice reports;
    ``constraint``: the request's structured-output spec (refused). 400s as
    ``check_beam_request``."""
    check_beam_request(body, constraint)
    engine = ctx.engine.engine
    searches = []
    for ids, max_tokens in jobs:
        params = beam_search_params(body, max_tokens)
        searches.append(BeamSearch(ids, params, engine.eos_token_ids, ctx.max_model_len,
                                   ctx.tokenizer.decode))
    step = step_sampling_params(searches[0].params, engine.eos_token_ids)
    if step.logprobs > ctx.max_logprobs:
        raise invalid(f"n={body.n} scores {step.logprobs} candidates per beam, over this "
                      f"server's --max-logprobs {ctx.max_logprobs}; lower n", "n")
    step.logprobs = max(step.logprobs, num_logprobs or 0)
    await asyncio.gather(*(_search(ctx.engine, search, step, f"{request_id}-{i}")
                           for i, search in enumerate(searches)))
    return [RequestOutput(f"{request_id}-{i}", None, ids, None,
                          [_choice(ctx, body, index, s) for index, s in
                           enumerate(search.result().sequences)], finished=True)
            for i, (search, (ids, _)) in enumerate(zip(searches, jobs))]


async def _search(engine, search: BeamSearch, step, request_id: str) -> None:
    num_steps = 0
    while not search.done:
        beams = search.beams_to_score()
        finals = await asyncio.gather(*(_final(engine, tokens, step, f"{request_id}-{num_steps}-{i}")
                                        for i, tokens in enumerate(beams)))
        search.advance([output.outputs[0].logprobs[0] for output in finals])
        num_steps += 1


async def _final(engine, prompt: list[int], params, request_id: str) -> RequestOutput:
    async for output in engine.generate(prompt, params, request_id):
        if output.finished:
            return output
    raise RuntimeError(f"beam request {request_id} ended without a final output")


def _choice(ctx, body, index: int, sequence: BeamSearchSequence) -> CompletionOutput:
    """A beam as a choice: the EOS ends it but is not text; a stop string cuts the text
    (kept with ``include_stop_str_in_output``)."""
    token_ids = sequence.output_token_ids
    text_ids = token_ids[:-1] if isinstance(sequence.stop_reason, int) else token_ids
    text = ctx.tokenizer.decode(text_ids, skip_special_tokens=body.skip_special_tokens)
    if isinstance(sequence.stop_reason, str):
        end = text.find(sequence.stop_reason)
        if end >= 0:
            text = text[:end + len(sequence.stop_reason) * body.include_stop_str_in_output]
    return CompletionOutput(index, text, token_ids, sequence.cum_logprob, sequence.logprobs,
                            sequence.finish_reason, sequence.stop_reason)
