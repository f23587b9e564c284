"""Logits -> next tokens, for a batch of requests, in batched tensor ops.

Processing order (each step skipped when no row in the batch uses it)::

    logits [B, V] (float32, raw)
      -> logit_bias, allowed_token_ids
      -> bad_words (a bad word's last token, where the output ends with the rest of it)
      -> constraint bitmask (structured outputs; bit set = allowed)
      -> penalties: repetition (prompt + output), presence and frequency (output)
      -> min_tokens (stop ids masked until enough tokens)
      -> temperature (rows with temperature 0 are greedy: argmax here)
      -> top-k, top-p, min-p
      -> sample: argmax(probs / q), q ~ Exp(1) drawn per row from the request's own
         generator when it has a seed (so a seeded request samples the same tokens alone
         or in any batch), else from the global generator
      -> logprobs of the raw logits (vLLM's default "raw_logprobs"): sampled token,
         its rank, and the top-k

Python loops run over rows (requests), never over the vocabulary.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from tamis.engine.request import Request
from tamis.engine.sampling_params import SAMPLING_EPS

_NEG_INF = float("-inf")


@dataclass
class SamplingMetadata:
    """Per-row sampling state for one step; row i is ``requests[i]``."""
    requests: list[Request]
    temperature: torch.Tensor        # float32 [B]; 0 for greedy rows
    top_k: torch.Tensor | None       # int64 [B]; V where disabled
    top_p: torch.Tensor | None       # float32 [B]
    min_p: torch.Tensor | None       # float32 [B]
    all_greedy: bool
    any_penalties: bool
    generators: dict[int, torch.Generator]
    max_num_logprobs: int            # -1: no row wants logprobs
    # Whether any row has logit_bias / allowed_token_ids, or min_tokens with stop ids:
    # the per-row loops of those steps are skipped when none has.
    any_bias_or_allowed: bool = True
    any_min_tokens: bool = True
    any_bad_words: bool = True
    # Tokens each row's request has sampled before this step, those still in flight
    # included (set per step by the engine); None: its appended output tokens.
    num_sampled: list[int] | None = None

    @classmethod
    def build(cls, requests: list[Request], vocab_size: int, device: torch.device) -> "SamplingMetadata":
        """Tensors go to ``device`` with non-blocking copies: a blocking one would wait for
        every step already queued on the device (the engine overlaps steps)."""
        params = [r.sampling_params for r in requests]
        temps = [0.0 if p.temperature < SAMPLING_EPS else p.temperature for p in params]
        as_f32 = lambda values: _to_device(values, torch.float32, device)  # noqa: E731
        top_k = top_p = min_p = None
        if any(p.top_k > 0 for p in params):
            top_k = _to_device([min(p.top_k, vocab_size) if p.top_k > 0 else vocab_size
                                for p in params], torch.int64, device)
        if any(p.top_p < 1.0 for p in params):
            top_p = as_f32([p.top_p for p in params])
        if any(p.min_p > 0.0 for p in params):
            min_p = as_f32([p.min_p for p in params])
        wanted = [_num_logprobs(p.logprobs, vocab_size) for p in params if p.logprobs is not None]
        return cls(
            requests=requests, temperature=as_f32(temps), top_k=top_k, top_p=top_p, min_p=min_p,
            all_greedy=all(t == 0.0 for t in temps),
            any_penalties=any(p.repetition_penalty != 1.0 or p.presence_penalty != 0.0
                              or p.frequency_penalty != 0.0 for p in params),
            generators={i: r.generator for i, r in enumerate(requests) if r.generator is not None},
            max_num_logprobs=max(wanted, default=-1),
            any_bias_or_allowed=any(p.logit_bias or p.allowed_token_ids is not None for p in params),
            any_min_tokens=any(p.min_tokens > 0 and p.all_stop_token_ids for p in params),
            any_bad_words=any(p.bad_words_token_ids for p in params))


def _to_device(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return _to_device_async(torch.tensor(values, dtype=dtype), device)


@dataclass
class TopLogprobs:
    """Logprobs of a set of positions: the chosen token plus the top-k."""
    token_ids: torch.Tensor      # int64 [N, 1 + k]; column 0 = the chosen/actual token
    logprobs: torch.Tensor       # float32 [N, 1 + k]
    ranks: torch.Tensor          # int64 [N]; rank of the chosen token (1 = most likely)


@dataclass
class SamplerOutput:
    token_ids: list[int]
    logprobs: TopLogprobs | None


class SampledTokens:
    """One step's sampled ids, still on their way to the host.

    ``token_ids`` stays on the device (the next step can read it there); copies to the
    host were queued right after sampling, so ``result()`` waits for this step's
    sampling only, not for steps queued after it."""

    def __init__(self, token_ids: torch.Tensor, top: TopLogprobs | None) -> None:
        self.token_ids = token_ids
        async_copy = token_ids.device.type == "cuda"
        to_host = lambda t: t.to("cpu", non_blocking=async_copy)  # noqa: E731  (pinned when async)
        self._host_ids = to_host(token_ids)
        self._host_top = (TopLogprobs(to_host(top.token_ids), to_host(top.logprobs), to_host(top.ranks))
                          if top is not None else None)
        self._ready = None
        if async_copy:
            self._ready = torch.cuda.Event()
            self._ready.record()

    def result(self) -> SamplerOutput:
        """Blocks until the ids are on the host."""
        if self._ready is not None:
            self._ready.synchronize()
        return SamplerOutput(self._host_ids.tolist(), self._host_top)


class Sampler:
    def __call__(self, logits: torch.Tensor, meta: SamplingMetadata,
                 bitmask: torch.Tensor | None = None,
                 bitmask_rows: list[int] | None = None) -> SamplerOutput:
        """``logits`` float32 [B, V] (modified in place). ``bitmask`` int32 [R, ceil(V/32)]
        applies its row j to logits row ``bitmask_rows[j]`` (all rows when None)."""
        token_ids, top = self.sample_on_device(logits, meta, bitmask, bitmask_rows)
        return SamplerOutput(token_ids.tolist(), top)

    def sample_on_device(self, logits: torch.Tensor, meta: SamplingMetadata,
                         bitmask: torch.Tensor | None = None, bitmask_rows: list[int] | None = None
                         ) -> tuple[torch.Tensor, TopLogprobs | None]:
        """As ``__call__``, without reading anything back: token ids int64 [B] and the
        logprobs stay on the logits' device."""
        raw_logprobs = None
        if meta.max_num_logprobs >= 0:
            raw_logprobs = torch.log_softmax(logits, dim=-1)
        if meta.any_bias_or_allowed:
            apply_bias_and_allowed(logits, meta.requests)
        if meta.any_bad_words:
            apply_bad_words(logits, meta.requests)
        if bitmask is not None:
            apply_bitmask(logits, bitmask, bitmask_rows)
        if meta.any_penalties:
            apply_penalties(logits, meta.requests)
        if meta.any_min_tokens:
            apply_min_tokens(logits, meta.requests, meta.num_sampled)
        token_ids = self.sample(logits, meta)
        top = None
        if raw_logprobs is not None:
            top = gather_logprobs(raw_logprobs, token_ids, meta.max_num_logprobs)
        return token_ids, top

    def sample(self, logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
        greedy = logits.argmax(dim=-1)
        if meta.all_greedy:
            return greedy
        temperature = torch.where(meta.temperature > 0, meta.temperature,
                                  torch.ones_like(meta.temperature))
        logits = logits / temperature.unsqueeze(1)
        logits = apply_top_k_top_p(logits, meta.top_k, meta.top_p)
        probs = torch.softmax(logits, dim=-1)
        if meta.min_p is not None:
            probs = apply_min_p(probs, meta.min_p)
        sampled = random_sample(probs, meta.generators)
        return torch.where(meta.temperature > 0, sampled, greedy)


def _num_logprobs(requested: int, vocab_size: int) -> int:
    return vocab_size if requested == -1 else min(requested, vocab_size)


def apply_bias_and_allowed(logits: torch.Tensor, requests: list[Request]) -> None:
    for row, request in enumerate(requests):
        params = request.sampling_params
        if params.allowed_token_ids is not None:
            allowed = torch.tensor(params.allowed_token_ids, device=logits.device)
            kept = logits[row, allowed]
            logits[row].fill_(_NEG_INF)
            logits[row, allowed] = kept
        if params.logit_bias:
            ids = torch.tensor(list(params.logit_bias), device=logits.device)
            bias = torch.tensor(list(params.logit_bias.values()), dtype=logits.dtype,
                                device=logits.device)
            logits[row].index_add_(0, ids, bias)


def apply_bad_words(logits: torch.Tensor, requests: list[Request]) -> None:
    """Bans the last token of each bad word whose other tokens end the output so far (a
    one-token bad word is always banned), as vLLM does. Only output tokens are matched
    (vLLM's rule): a bad word begun at the end of the prompt is not caught."""
    for row, request in enumerate(requests):
        output = request.output_token_ids
        for word in request.sampling_params.bad_words_token_ids:
            prefix_len = len(word) - 1
            if prefix_len > len(output):
                continue
            if prefix_len == 0 or output[-prefix_len:] == word[:-1]:
                logits[row, word[-1]] = _NEG_INF


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int] | None) -> None:
    """Disallowed tokens -> -inf. Uses the kernels subpackage's op when present. A host
    ``bitmask`` is uploaded without waiting for the device (through pinned memory on
    CUDA): the forward pass queued before it keeps running while the host goes on."""
    bitmask = _to_device_async(bitmask, logits.device)
    if rows is not None and len(rows) != logits.shape[0]:
        # The op masks row i of the logits with row i of the mask: gather, mask, scatter.
        index = _to_device_async(torch.tensor(rows, dtype=torch.int64), logits.device)
        sub = logits[index].contiguous()
        _apply_token_bitmask(sub, bitmask)
        logits[index] = sub
        return
    _apply_token_bitmask(logits, bitmask)


def _to_device_async(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``host`` on ``device``; a CUDA upload goes through pinned memory, non-blocking (the
    caching host allocator keeps the pinned copy until the transfer is done)."""
    if host.device == device:
        return host
    if device.type == "cuda" and host.device.type == "cpu":
        return host.pin_memory().to(device, non_blocking=True)
    return host.to(device)


def _apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    try:
        from tamis.kernels.bitmask import apply_token_bitmask_
    except ImportError:
        apply_token_bitmask_ = _apply_token_bitmask_local
    apply_token_bitmask_(logits, bitmask)


def _apply_token_bitmask_local(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    shifts = torch.arange(32, device=bitmask.device, dtype=torch.int32)
    allowed = ((bitmask.unsqueeze(-1) >> shifts) & 1).bool().flatten(-2)
    vocab = logits.shape[-1]
    if allowed.shape[-1] < vocab:
        allowed = torch.cat([allowed, allowed.new_zeros(allowed.shape[0], vocab - allowed.shape[-1])], -1)
    logits.masked_fill_(~allowed[:, :vocab], _NEG_INF)


def apply_penalties(logits: torch.Tensor, requests: list[Request]) -> None:
    """vLLM's penalties: repetition over prompt + output tokens (divide positive logits,
    multiply negative ones), frequency and presence over output tokens only."""
    batch, vocab = logits.shape
    device = logits.device
    output_counts = torch.zeros(batch, vocab, dtype=torch.float32, device=device)
    seen = torch.zeros(batch, vocab, dtype=torch.bool, device=device)
    for row, request in enumerate(requests):
        if request.output_token_ids:
            ids = torch.tensor(request.output_token_ids, device=device)
            output_counts[row].index_add_(0, ids, torch.ones(len(ids), device=device))
        seen[row, torch.tensor(request.prompt_token_ids, device=device)] = True
    seen |= output_counts > 0
    params = [r.sampling_params for r in requests]
    rep = torch.tensor([p.repetition_penalty for p in params], device=device).unsqueeze(1)
    freq = torch.tensor([p.frequency_penalty for p in params], device=device).unsqueeze(1)
    pres = torch.tensor([p.presence_penalty for p in params], device=device).unsqueeze(1)
    penalized = torch.where(logits > 0, logits / rep, logits * rep)
    logits.copy_(torch.where(seen, penalized, logits))
    logits -= freq * output_counts + pres * (output_counts > 0).float()


def apply_min_tokens(logits: torch.Tensor, requests: list[Request],
                     num_sampled: list[int] | None = None) -> None:
    """Masks the stop ids of every row whose request has sampled fewer than its
    ``min_tokens`` (``num_sampled[row]`` tokens, default its appended output tokens):
    one indexed write for the whole batch, its indices copied without waiting."""
    rows, ids = [], []
    vocab = logits.shape[1]
    for row, request in enumerate(requests):
        params = request.sampling_params
        count = request.num_output_tokens if num_sampled is None else num_sampled[row]
        if count < params.min_tokens and params.all_stop_token_ids:
            stop = [t for t in params.all_stop_token_ids if t < vocab]
            rows += [row] * len(stop)
            ids += stop
    if rows:
        index = _to_device_async(torch.tensor([rows, ids], dtype=torch.int64), logits.device)
        logits[index[0], index[1]] = _NEG_INF


def apply_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor | None,
                      top_p: torch.Tensor | None) -> torch.Tensor:
    """Masks logits outside each row's top-k and top-p nucleus (the most likely token always stays)."""
    if top_k is None and top_p is None:
        return logits
    sorted_logits, order = logits.sort(dim=-1, descending=False)
    vocab = logits.shape[-1]
    if top_k is not None:
        kth = sorted_logits.gather(1, (vocab - top_k).unsqueeze(1))
        sorted_logits.masked_fill_(sorted_logits < kth, _NEG_INF)
    if top_p is not None:
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        outside = cumulative <= (1 - top_p).unsqueeze(1)
        outside[:, -1] = False
        sorted_logits.masked_fill_(outside, _NEG_INF)
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)


def apply_min_p(probs: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    threshold = probs.amax(dim=-1, keepdim=True) * min_p.unsqueeze(1)
    return probs.masked_fill(probs < threshold, 0.0)


def random_sample(probs: torch.Tensor, generators: dict[int, torch.Generator]) -> torch.Tensor:
    """Exponential-race sampling: argmax(p / q), q ~ Exp(1), equivalent to drawing from p."""
    q = torch.empty_like(probs)
    if len(generators) < probs.shape[0]:
        q.exponential_()
    for row, generator in generators.items():
        q[row].exponential_(generator=generator)
    return probs.div(q).argmax(dim=-1)


def gather_logprobs(logprobs: torch.Tensor, chosen: torch.Tensor, k: int) -> TopLogprobs:
    """The chosen tokens' logprobs and ranks plus the top ``k`` of each row."""
    chosen = chosen.unsqueeze(1)
    chosen_lp = logprobs.gather(1, chosen)
    ranks = (logprobs > chosen_lp).sum(dim=-1) + 1
    if k > 0:
        top_lp, top_ids = logprobs.topk(k, dim=-1)
        return TopLogprobs(torch.cat([chosen, top_ids], 1), torch.cat([chosen_lp, top_lp], 1), ranks)
    return TopLogprobs(chosen, chosen_lp, ranks)


__all__ = ["Sampler", "SamplingMetadata", "SamplerOutput", "SampledTokens", "TopLogprobs", "gather_logprobs",
           "apply_top_k_top_p", "apply_min_p", "apply_penalties", "apply_bad_words"]
