"""A stand-in ``LLMEngine`` for the server's unit tests: same interface, no model.

Each step gives every running request one token per choice, cycling through a fixed
text, so tests can check streaming, n, stop strings, logprobs, aborts and back-pressure
in milliseconds. The real engine is exercised by ``test_openai_e2e.py``.
"""
from __future__ import annotations

import copy
import math
import threading
import time
from dataclasses import dataclass

from tamis.engine.outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput

TEXT = " The quick brown fox jumps over the lazy dog. It was a sunny day."


@dataclass
class FakeStats:
    num_running: int
    num_waiting: int
    kv_cache_usage: float
    num_free_blocks: int
    num_total_blocks: int


class FakeEngine:
    def __init__(self, tokenizer, step_seconds: float = 0.001, total_blocks: int = 64,
                 max_running: int = 256):
        self.tokenizer = tokenizer
        self.config = type("Cfg", (), {"max_model_len": 2048, "max_logprobs": 20})()
        self.hf_config = None
        self.step_seconds = step_seconds
        self.total_blocks = total_blocks
        self.max_running = max_running
        self.script = tokenizer.encode(TEXT, add_special_tokens=False)
        self.requests: dict[str, dict] = {}
        self.aborted: list[str] = []
        self.fail_next_step: Exception | None = None
        self.thread_ids: set[int] = set()
        self.fail_token: int | None = None  # prompts holding it fail in the engine

    # -- LLMEngine interface --
    def add_request(self, request_id, prompt, params, priority=0):
        self.thread_ids.add(threading.get_ident())
        if isinstance(prompt, str):
            prompt = self.tokenizer.encode(prompt)
        if getattr(params, "extra_args", None) and params.extra_args.get("fail_on_add"):
            raise ValueError("fail_on_add was set")
        if self.fail_token is not None and self.fail_token in prompt:
            params = copy.copy(params)
            params.extra_args = {"fail_in_engine": True}
        self.requests[request_id] = {"prompt": list(prompt), "params": params,
                                     "choices": [[] for _ in range(params.n)],
                                     "done": [None] * params.n, "arrival": time.time()}

    def abort_request(self, ids):
        self.thread_ids.add(threading.get_ident())
        for request_id in ids:
            if self.requests.pop(request_id, None) is not None:
                self.aborted.append(request_id)

    def has_unfinished_requests(self):
        return bool(self.requests)

    def step(self):
        self.thread_ids.add(threading.get_ident())
        if self.fail_next_step is not None:
            raise self.fail_next_step
        time.sleep(self.step_seconds)
        outputs = []
        for request_id, req in list(self.requests.items())[: self.max_running]:
            outputs.append(self._advance(request_id, req))
            if outputs[-1].finished:
                del self.requests[request_id]
        return outputs

    def get_stats(self):
        running = min(len(self.requests), self.max_running)
        used = min(self.total_blocks, running)
        return FakeStats(running, len(self.requests) - running, used / self.total_blocks,
                         self.total_blocks - used, self.total_blocks)

    # -- internals --
    def _advance(self, request_id, req) -> RequestOutput:
        params = req["params"]
        choices = []
        for i, tokens in enumerate(req["choices"]):
            if req["done"][i] is None:
                tokens.append(self.script[(len(tokens) + i) % len(self.script)])
                text = self.tokenizer.decode(tokens)
                hit = next((s for s in params.stop if s in text), None)
                if hit is not None:
                    req["done"][i] = ("stop", hit)
                elif len(tokens) >= params.max_tokens:
                    req["done"][i] = ("length", None)
            choices.append(self._choice(i, tokens, req["done"][i], params))
        finished = all(d is not None for d in req["done"])
        if getattr(params, "extra_args", None) and params.extra_args.get("fail_in_engine"):
            choices[0].finish_reason = "error"
            code = params.extra_args.get("error_code")
            return RequestOutput(request_id, None, req["prompt"], None, choices, True,
                                 error="grammar failed to compile (fake)", error_code=code)
        return RequestOutput(request_id, None, req["prompt"], None, choices, finished,
                             metrics=RequestMetrics(arrival_time=req["arrival"],
                                                    first_scheduled_time=req["arrival"]))

    def _choice(self, index, tokens, done, params) -> CompletionOutput:
        text = self.tokenizer.decode(tokens)
        reason, stop = done if done else (None, None)
        if stop is not None:
            text = text[: text.index(stop)]
        logprobs = None
        if params.logprobs is not None:
            logprobs = [{t: Logprob(math.log(0.5), 1), (t + 1): Logprob(math.log(0.25), 2),
                         (t + 2): Logprob(math.log(0.125), 3)} for t in tokens]
        return CompletionOutput(index, text, list(tokens), None, logprobs, reason, stop)
