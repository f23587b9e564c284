"""``POST /v1/completions``.

A prompt is a string, a list of strings, a list of token ids or a list of those lists;
each prompt is one engine request and its ``n`` choices are numbered
``prompt_index * n + choice_index``, as OpenAI does. ``suffix`` (insertion) is refused:
no served model has a fill-in-the-middle template. ``truncate_prompt_tokens`` cuts each
prompt (``echo`` then repeats what was kept). Each choice carries vLLM's extras when asked:
``prompt_logprobs`` (also with ``echo`` and ``logprobs``), and ``prompt_token_ids`` /
``token_ids`` with ``return_token_ids`` (streamed: the prompt's ids in a choice's first
chunk, then each chunk's new ids).
"""
from __future__ import annotations

import time

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from tamis.server.beam import beam_search_outputs
from tamis.server.context import ServerContext
from tamis.server.errors import invalid
from tamis.server.fields import check_request_fields, request_ids
from tamis.server.logprobs import completion_logprobs, prompt_logprobs_json, token_id_text
from tamis.server.protocol import CompletionRequest
from tamis.server.sampling import (build_sampling_params, check_stream_options, engine_prompt,
                                   max_tokens_for, truncate_prompt)
from tamis.server.streaming import Cursor, merge, sse_body, start_generations
from tamis.server.structured import resolve_structured_outputs


async def completion_prompts(ctx: ServerContext,
                             body: CompletionRequest) -> list[tuple[str, list[int]]]:
    """Every prompt as (text, token ids); 400 for an empty or malformed prompt."""
    prompt = body.prompt
    if isinstance(prompt, str):
        prompt = [prompt]
    elif prompt and isinstance(prompt[0], int):
        prompt = [prompt]
    if not prompt:
        raise invalid("prompt must not be empty", "prompt")
    out = []
    truncated = body.truncate_prompt_tokens is not None
    for item in prompt:
        if isinstance(item, str):
            ids = await ctx.encode(item, "prompt", truncated=truncated,
                                   add_special_tokens=body.add_special_tokens)
            text = item
        else:
            ids = list(item)
            ctx.check_token_ids(ids, "prompt")
            text = None
        kept = truncate_prompt(ids, body, body.max_tokens, ctx.max_model_len)
        if text is None or len(kept) < len(ids):
            text = ctx.tokenizer.decode(kept)
        ids = kept
        if not ids:
            raise invalid("prompt must hold at least one token", "prompt")
        out.append((text, ids))
    return out


async def create_completion(ctx: ServerContext, body: CompletionRequest, raw: Request):
    model = ctx.check_model(body.model)
    check_request_fields(ctx, body)
    check_stream_options(body)
    if body.suffix:
        raise invalid("suffix is not supported: the served model has no fill-in-the-middle "
                      "template; put the text in the prompt instead", "suffix")
    ctx.check_logprobs(body.logprobs, "logprobs")
    prompts = await completion_prompts(ctx, body)
    constraint = resolve_structured_outputs(body)
    if ctx.metrics is not None:
        ctx.metrics.observe_constraint(constraint)
    response_id, engine_id = request_ids(raw, body, "cmpl")
    writer = _CompletionWriter(ctx, body, model, response_id, prompts, raw)
    if body.use_beam_search:
        jobs = [(ids, max_tokens_for(body.max_tokens, len(ids), ctx.max_model_len))
                for _, ids in prompts]
        outputs = await beam_search_outputs(ctx, body, jobs, engine_id, body.logprobs, constraint)
        return JSONResponse(writer.response(outputs))
    jobs = []
    for i, (_text, ids) in enumerate(prompts):
        max_tokens = max_tokens_for(body.max_tokens, len(ids), ctx.max_model_len)
        params = build_sampling_params(body, max_tokens=max_tokens, logprobs=body.logprobs,
                                       structured_outputs=constraint)
        if body.echo and body.logprobs is not None:
            params.prompt_logprobs = body.logprobs
        jobs.append((f"{engine_id}-{i}", engine_prompt(ids, body), params, body.priority))
    gens = await start_generations(ctx.engine, jobs)
    if body.stream:
        return StreamingResponse(writer.stream(gens), media_type="text/event-stream")
    finals = {}
    async for index, output in merge(gens):
        finals[index] = output
    return JSONResponse(writer.response([finals[i] for i in range(len(gens))]))


class _CompletionWriter:
    """Builds the JSON body or the SSE chunks of one completion request."""

    def __init__(self, ctx, body, model, request_id, prompts, raw):
        self.ctx, self.body, self.model = ctx, body, model
        self.request_id, self.prompts, self.raw = request_id, prompts, raw
        self.created = int(time.time())
        self.token_text = token_id_text if body.return_tokens_as_token_ids else ctx.token_text
        self.wants_prompt_logprobs = body.prompt_logprobs is not None or (
            body.echo and body.logprobs is not None)

    def _logprobs(self, prompt_index, choice, start_token, text_offset, prompt_output=None):
        if self.body.logprobs is None:
            return None
        ids, positions = list(choice.token_ids[start_token:]), list(
            (choice.logprobs or [])[start_token:])
        if prompt_output is not None:
            ids = self.prompts[prompt_index][1] + ids
            positions = list(prompt_output.prompt_logprobs or
                              [None] * len(self.prompts[prompt_index][1])) + positions
        return completion_logprobs(ids, positions, self.body.logprobs, self.token_text,
                                   text_offset)

    def _extras(self, prompt_index, output, choice, start_token: int = 0,
                first: bool = True) -> dict:
        """vLLM's per-choice extras: prompt logprobs, prompt and output token ids."""
        extras = {}
        if self.wants_prompt_logprobs and first:
            extras["prompt_logprobs"] = prompt_logprobs_json(output.prompt_logprobs,
                                                             self.token_text)
        if self.body.return_token_ids:
            if first:
                extras["prompt_token_ids"] = list(self.prompts[prompt_index][1])
            extras["token_ids"] = list(choice.token_ids[start_token:])
        return extras

    def _choice(self, prompt_index, output, choice) -> dict:
        text = choice.text
        echo = self.body.echo
        if echo:
            text = self.prompts[prompt_index][0] + text
        return {"index": prompt_index * self.body.n + choice.index, "text": text,
                "logprobs": self._logprobs(prompt_index, choice, 0, 0,
                                           output if echo else None),
                "finish_reason": choice.finish_reason, "stop_reason": choice.stop_reason,
                **self._extras(prompt_index, output, choice)}

    def usage(self, outputs) -> dict:
        prompt = sum(len(ids) for _, ids in self.prompts)
        completion = sum(len(c.token_ids) for o in outputs for c in o.outputs)
        usage = {"prompt_tokens": prompt, "completion_tokens": completion,
                 "total_tokens": prompt + completion}
        self.raw.scope.setdefault("state", {})["usage"] = usage
        return usage

    def _envelope(self, choices) -> dict:
        return {"id": self.request_id, "object": "text_completion", "created": self.created,
                "model": self.model, "choices": choices}

    def response(self, outputs) -> dict:
        choices = [self._choice(p, o, c) for p, o in enumerate(outputs) for c in o.outputs]
        choices.sort(key=lambda c: c["index"])
        body = self._envelope(choices)
        body["usage"] = self.usage(outputs)
        return body

    async def stream(self, gens):
        cursors: dict[tuple[int, int], Cursor] = {}
        latest = {}
        options = self.body.stream_options

        def chunks(p, output):
            latest[p] = output
            choices = []
            for choice in output.outputs:
                cursor = cursors.setdefault((p, choice.index), Cursor())
                delta = self._delta(p, output, choice, cursor)
                if delta is not None:
                    choices.append(delta)
            if not choices:
                return []
            chunk = self._envelope(choices)
            if options is not None and options.continuous_usage_stats:
                chunk["usage"] = self.usage(list(latest.values()))
            return [chunk]

        def closing_chunk():
            usage = self.usage(list(latest.values()))   # also recorded for the access log
            if options is not None and options.include_usage:
                return {**self._envelope([]), "usage": usage}
            return None

        async for line in sse_body(gens, chunks, closing_chunk):
            yield line

    def _delta(self, p, output, choice, cursor: "Cursor") -> dict | None:
        if cursor.done or not cursor.has_news(choice):
            return None
        first = not cursor.started
        echo = self.body.echo and first
        prefix = self.prompts[p][0] if echo else ""
        logprobs = self._logprobs(p, choice, cursor.tokens, cursor.text,
                                  output if echo else None)
        extras = self._extras(p, output, choice, cursor.tokens, first)
        text = cursor.advance(choice)
        return {"index": p * self.body.n + choice.index, "text": prefix + text,
                "logprobs": logprobs, "finish_reason": choice.finish_reason,
                "stop_reason": choice.stop_reason, **extras}


