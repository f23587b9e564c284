"""The offline Python API: ``LLM(model=None, **engine_args)``.

    from tamis import LLM, SamplingParams
    llm = LLM()                                   # the embedded SmolLM2-135M-Instruct
    outputs = llm.generate(["The capital of France is"], SamplingParams(max_tokens=16))
    print(outputs[0].outputs[0].text)

``generate`` takes one prompt or a list: strings, token-id lists, or vLLM's dict prompts
(``{"prompt": ...}`` / ``{"prompt_token_ids": [...]}``), and one ``SamplingParams`` for all
or one per prompt. Outputs come back in input order, finished. Engine arguments keep
vLLM's names (``max_model_len``, ``dtype``, ``seed``, ``enable_prefix_caching``...).
``beam_search(prompts, BeamSearchParams(...))`` is vLLM's too (``engine/beam_search.py``).
``shutdown()`` (or ``with LLM(...) as llm:``) stops the processes a parallel engine started.
"""
from __future__ import annotations

import itertools
from typing import Any, Sequence

from tamis.engine.beam_search import (BeamSearch, BeamSearchOutput, BeamSearchParams,
                                      step_sampling_params)
from tamis.engine.config import EngineConfig
from tamis.engine.engine import LLMEngine
from tamis.engine.outputs import RequestOutput
from tamis.engine.sampling_params import RequestOutputKind, SamplingParams

Prompt = str | list[int] | dict
Message = dict[str, Any]


class LLM:
    def __init__(self, model: str | None = None, **engine_args: Any) -> None:
        self.llm_engine = LLMEngine(EngineConfig.from_kwargs(model=model, **engine_args))
        self._ids = itertools.count()

    def shutdown(self) -> None:
        """Stops the processes the engine started (a parallel model's other ranks, the
        structured-output workers). Idempotent; ``with LLM(...) as llm:`` calls it on exit.
        Without it they are stopped when the interpreter exits."""
        self.llm_engine.shutdown()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.shutdown()

    def get_tokenizer(self):
        return self.llm_engine.tokenizer

    def reset_prefix_cache(self) -> bool:
        """Drops every cached prefix block no running request holds (vLLM's name); False
        when some are still held."""
        return self.llm_engine.reset_prefix_cache()

    def get_default_sampling_params(self) -> SamplingParams:
        return SamplingParams()

    def generate(self, prompts: Prompt | Sequence[Prompt],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = True, priority: list[int] | None = None) -> list[RequestOutput]:
        """Generates for every prompt; returns finished ``RequestOutput``s in input order.
        Raises ValueError for a bad prompt or parameter before anything runs."""
        prompts = _as_prompt_list(prompts)
        params = _per_prompt(sampling_params, len(prompts), "sampling_params")
        priorities = _per_prompt(priority if priority is not None else 0, len(prompts), "priority")
        return self._run(prompts, params, priorities, use_tqdm)

    def beam_search(self, prompts: Prompt | Sequence[Prompt], params: BeamSearchParams,
                    use_tqdm: bool = False) -> list[BeamSearchOutput]:
        """Beam search for every prompt (all searched together, one engine step loop per
        token); returns one ``BeamSearchOutput`` per prompt, in input order, each with its
        ``beam_width`` best sequences, best first. A sequence's ``text`` decodes its
        ``tokens`` (prompt included, special tokens kept), as vLLM's does. Raises
        ValueError for a bad prompt or parameter before anything runs."""
        if not isinstance(params, BeamSearchParams):
            raise ValueError(f"params must be BeamSearchParams, got {type(params).__name__}")
        engine = self.llm_engine
        step_params = step_sampling_params(params, engine.eos_token_ids)
        limit = engine.config.max_logprobs
        if limit != -1 and step_params.logprobs > limit:
            raise ValueError(f"beam_width={params.beam_width} scores {step_params.logprobs} "
                             f"candidates per beam, over the engine's max_logprobs={limit} "
                             f"(raise max_logprobs or lower beam_width)")
        tokenizer = self.get_tokenizer()
        decode = tokenizer.decode if tokenizer is not None else None
        searches = [BeamSearch(self._prompt_token_ids(p), params, engine.eos_token_ids,
                               engine.max_model_len, decode) for p in _as_prompt_list(prompts)]
        bar = _progress_bar(params.max_tokens, "Beam search") if use_tqdm else None
        while not all(search.done for search in searches):
            self._beam_step([search for search in searches if not search.done], step_params)
            if bar is not None:
                bar.update(1)
        if bar is not None:
            bar.close()
        outputs = [search.result() for search in searches]
        for sequence in (s for output in outputs for s in output.sequences):
            sequence.text = decode(sequence.tokens) if decode is not None else None
        return outputs

    def _beam_step(self, searches: list[BeamSearch], step_params: SamplingParams) -> None:
        """Scores every live beam of ``searches`` in one batch and advances them."""
        beams = [(search, tokens) for search in searches for tokens in search.beams_to_score()]
        outputs = self._run([tokens for _, tokens in beams], [step_params] * len(beams),
                            [0] * len(beams), use_tqdm=False)
        start = 0
        for search in searches:
            count = len(search.live)
            search.advance([out.outputs[0].logprobs[0] for out in outputs[start:start + count]])
            start += count

    def _prompt_token_ids(self, prompt: Prompt) -> list[int]:
        """A prompt as token ids, tokenized as ``generate`` does."""
        if isinstance(prompt, dict):
            prompt = prompt.get("prompt_token_ids", prompt.get("prompt"))
        if isinstance(prompt, str):
            tokenizer = self.get_tokenizer()
            if tokenizer is None:
                raise ValueError("text prompts need a tokenizer (the engine runs with skip_tokenizer_init)")
            prompt = tokenizer.encode(prompt)
        if not isinstance(prompt, (list, tuple)) or not prompt:
            raise ValueError("a prompt must be a non-empty string or list of token ids")
        return list(prompt)

    def chat(self, messages: list[Message] | list[list[Message]],
             sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
             use_tqdm: bool = True, add_generation_prompt: bool = True,
             continue_final_message: bool = False, chat_template: str | None = None,
             chat_template_kwargs: dict[str, Any] | None = None,
             tools: list[dict] | None = None) -> list[RequestOutput]:
        """Applies the tokenizer's chat template to one conversation (a list of messages)
        or several, then generates. Returns one output per conversation."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        prompts = [self._render_chat(c, add_generation_prompt, continue_final_message, chat_template,
                                     chat_template_kwargs or {}, tools) for c in conversations]
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)

    def extract(self, texts: str | Sequence[str], schema: Any,
                sampling_params: SamplingParams | None = None, instruction: str | None = None,
                use_tqdm: bool = False) -> list[Any]:
        """Extracts one object per text, constrained by ``schema`` (a JSON-schema dict or a
        pydantic model class). Returns validated objects in input order: pydantic instances
        for a model class, parsed JSON otherwise. Raises ValueError naming the text whose
        output did not finish (raise ``max_tokens``) or did not validate."""
        from tamis.constrain import StructuredOutputsParams
        texts = [texts] if isinstance(texts, str) else list(texts)
        model = schema if hasattr(schema, "model_json_schema") else None
        json_schema = model.model_json_schema() if model is not None else schema
        params = (sampling_params or SamplingParams(temperature=0.0, max_tokens=512)).clone()
        params.structured_outputs = StructuredOutputsParams(json=json_schema)
        ask = instruction or "Extract the information from the text as JSON matching this schema"
        conversations = [[{"role": "user", "content":
                           f"{ask}:\n{_json_dumps(json_schema)}\n\nText:\n{text}"}] for text in texts]
        outputs = self.chat(conversations, params, use_tqdm=use_tqdm)
        validate = _validator(json_schema, model)
        return [_validated(output, i, validate) for i, output in enumerate(outputs)]

    def _render_chat(self, conversation: list[Message], add_generation_prompt: bool,
                     continue_final_message: bool, chat_template: str | None,
                     kwargs: dict[str, Any], tools: list[dict] | None) -> dict:
        tokenizer = self.get_tokenizer()
        if tokenizer is None:
            raise ValueError("chat needs a tokenizer (the engine runs with skip_tokenizer_init)")
        if not isinstance(conversation, list) or not all(isinstance(m, dict) for m in conversation):
            raise ValueError("a conversation must be a list of {'role': ..., 'content': ...} dicts")
        text = tokenizer.apply_chat_template(
            conversation, tokenize=False, add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message, chat_template=chat_template,
            tools=tools, **kwargs)
        # The template already holds the special tokens (BOS, role markers).
        return {"prompt_token_ids": tokenizer.encode(text, add_special_tokens=False)}

    def _run(self, prompts: list[Prompt], params: list[SamplingParams | None],
             priorities: list[int], use_tqdm: bool) -> list[RequestOutput]:
        engine = self.llm_engine
        ids = []
        try:
            for prompt, sp, priority in zip(prompts, params, priorities):
                sp = (sp or SamplingParams()).clone()
                sp.output_kind = RequestOutputKind.FINAL_ONLY   # only the end result is kept
                request_id = str(next(self._ids))
                engine.add_request(request_id, prompt, sp, priority=priority)
                ids.append(request_id)
        except Exception:
            engine.abort_request(ids)   # all or nothing: a bad prompt queues none
            raise
        return self._drain(ids, use_tqdm)

    def _drain(self, ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        results: dict[str, RequestOutput] = {}
        bar = _progress_bar(len(ids)) if use_tqdm else None
        try:
            while len(results) < len(ids):
                for output in self.llm_engine.step():
                    if output.finished:
                        results[output.request_id] = output
                        if bar is not None:
                            bar.update(1)
        finally:
            if bar is not None:
                bar.close()
        return [results[i] for i in ids]


def _json_dumps(value: Any) -> str:
    import json
    return json.dumps(value, ensure_ascii=False)


def _validator(schema: dict, model: Any):
    """One parse-and-validate function for every output: the schema is checked against its
    metaschema once here, not once per output (``jsonschema.validate`` does that each call,
    ~10 ms for a schema with $defs)."""
    import json
    if model is not None:
        return model.model_validate_json
    import jsonschema   # outside the callers' try: a missing dependency is no failed validation
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    validator = cls(schema)

    def validate(text: str) -> Any:
        value = json.loads(text)
        validator.validate(value)
        return value
    return validate


def _validated(output: RequestOutput, index: int, validate) -> Any:
    completion = output.outputs[0]
    if completion.finish_reason != "stop":
        raise ValueError(f"extraction of text {index} did not finish "
                         f"(finish_reason={completion.finish_reason!r}); raise max_tokens")
    try:
        return validate(completion.text)
    except Exception as exc:
        raise ValueError(f"extraction of text {index} does not validate: {exc}") from None


def _as_prompt_list(prompts: Any) -> list[Prompt]:
    if isinstance(prompts, (str, dict)):
        return [prompts]
    prompts = list(prompts)
    if prompts and all(isinstance(p, int) and not isinstance(p, bool) for p in prompts):
        return [prompts]   # one prompt given as token ids
    if not prompts:
        raise ValueError("prompts is empty: give at least one prompt")
    return prompts


def _per_prompt(value: Any, count: int, name: str) -> list:
    if isinstance(value, (list, tuple)):
        if len(value) != count:
            raise ValueError(f"{name} has {len(value)} entries for {count} prompts")
        return list(value)
    return [value] * count


def _progress_bar(total: int, desc: str = "Processed prompts"):
    from tqdm.auto import tqdm
    return tqdm(total=total, desc=desc, dynamic_ncols=True)


__all__ = ["LLM"]
