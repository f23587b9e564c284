"""The engine's bridge to tamis.constrain (contract: docs/contracts.md).

    StructuredOutputManager(tokenizer, vocab_size, config, eos_token_ids=(), num_workers=0,
                            pin_memory=False)
      .add_request(request)            starts compiling in the pool (cached); never blocks
      .is_ready(request) -> bool       True once compiled; raises StructuredOutputError if the
                                       compile failed or ran past the time limit
      .fill_bitmask(requests)          int32 [len(requests), ceil(V/32)] (bit set = allowed;
                                       unconstrained rows all ones) or None if none constrained;
                                       the tensor is reused: valid until the call after
                                       next (page-locked with ``pin_memory``). The
                                       EOS policy is applied here: ``eos_token_ids`` (the
                                       engine's stop ids, which may include ids the grammar
                                       sees as text) are allowed only where the output is a
                                       complete match or the request ignores EOS
      .accept_token(request, tok)      advances the request's matcher; False = violation
      .is_terminated(request)          the output so far is a complete match: EOS may be
                                       sampled now
      .jump_forward_tokens(request)    tokens the constraint forces next, ALREADY ACCEPTED by
                                       the matcher: the engine appends them to the output and
                                       computes them in the next forward pass (no sampling)
      .remove_request(request)         forgets the request's matcher (call when it finishes)
      .close()                         stops the mask row worker processes (``num_workers``:
                                       ``tamis.constrain.row_workers``), if any
      .error(request) -> str | None    set when a matcher failed mid-decode (a lazy compile
                                       step raised inside fill_bitmask): the request's rows
                                       then allow EOS only and is_terminated is True, so it
                                       ends instead of taking the engine step down

A request is constrained when ``request.sampling_params.structured_outputs`` is set. The
manager keys its state by ``request.request_id``. ``config.structured_outputs_backend`` picks
the compiler: "tamis"/"auto" (ours), or "xgrammar"/"llguidance" when installed
(``tamis.constrain.backends``); ValueError if the named one is not installed.
"""
from __future__ import annotations

import logging
import time

import numpy as np

from tamis.constrain import CompileTimeout, StructuredOutputsParams, TokenizerInfo, prefetch
from tamis.constrain.backends import check_installed, make_compiler
from tamis.constrain.compiler import DEFAULT_TIME_LIMIT_S
from tamis.constrain.matcher import RegexMatcher
from tamis.constrain.row_workers import RowWorkers


logger = logging.getLogger(__name__)

COMPILE_TIME_LIMIT = "compile_time_limit"   # StructuredOutputError.code of a compile too slow


class StructuredOutputError(ValueError):
    """A request's constraint failed to compile; the message says why. ``code`` is
    ``"compile_time_limit"`` when the compile ran past the server's time limit (a limit of
    the server, reported apart from constraints that are wrong), else None."""

    def __init__(self, message: str, code: str | None = None):
        super().__init__(message)
        self.code = code


class StructuredOutputManager:
    def __init__(self, tokenizer, vocab_size: int, config=None, eos_token_ids=(),
                 num_workers: int = 0, pin_memory: bool = False):
        self.backend = check_installed(getattr(config, "structured_outputs_backend", None))
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.info = TokenizerInfo.from_hf(tokenizer, vocab_size=vocab_size)
        self.time_limit_s = getattr(config, "structured_outputs_time_limit_s", DEFAULT_TIME_LIMIT_S)
        self.compiler = make_compiler(self.backend, tokenizer, vocab_size, self.info, self.time_limit_s)
        self._futures: dict = {}
        self._submitted_at: dict = {}
        self._matchers: dict = {}
        self._errors: dict = {}      # request id -> message: failed after it started
        self._bitmasks = _BitmaskBuffers(self.info.num_words, pin_memory)
        self._eos_words, self._eos_keep = _eos_clearing(eos_token_ids, self.info.num_words)
        self.row_workers = None
        if num_workers > 0:
            self.row_workers = RowWorkers(self.info, num_workers)
            # The workers build new rows at fill time; the prefetch thread would build the
            # same rows at accept time, right before, competing for the GIL (``close``
            # turns it back on).
            self._prefetch_was = prefetch.enabled()
            prefetch.set_enabled(False)
        self.mask_seconds = 0.0      # cumulative time filling bitmasks, for metrics

    # ---- lifecycle ------------------------------------------------------------------------
    @staticmethod
    def params_of(request) -> StructuredOutputsParams | None:
        sampling = getattr(request, "sampling_params", None) or getattr(request, "params", None)
        params = getattr(sampling, "structured_outputs", None)
        if isinstance(params, dict):
            params = StructuredOutputsParams.from_dict(params)
        return params

    def add_request(self, request) -> None:
        params = self.params_of(request)
        if params is None:
            return
        params.validate()
        rid = request.request_id
        self._futures[rid] = self.compiler.submit(params)
        self._submitted_at[rid] = time.monotonic()

    def is_ready(self, request) -> bool:
        rid = request.request_id
        if rid in self._matchers:
            return True
        future = self._futures.get(rid)
        if future is None:
            return True          # not constrained
        if not future.done():
            waited = time.monotonic() - self._submitted_at[rid]
            if waited > self.time_limit_s * 1.5 + 1.0:
                self._drop(rid)
                raise StructuredOutputError(
                    f"structured output compilation ran past the time limit of "
                    f"{self.time_limit_s:g}s ({waited:.1f}s without a result)", COMPILE_TIME_LIMIT)
            return False
        try:
            compiled = future.result()
        except CompileTimeout as exc:
            self._drop(rid)
            raise StructuredOutputError(str(exc), COMPILE_TIME_LIMIT) from None
        except Exception as exc:
            self._drop(rid)
            raise StructuredOutputError(str(exc)) from None
        self._matchers[rid] = compiled.matcher()
        del self._futures[rid]
        return True

    def remove_request(self, request) -> None:
        self._drop(request.request_id)

    def _drop(self, rid) -> None:
        self._futures.pop(rid, None)
        self._submitted_at.pop(rid, None)
        self._matchers.pop(rid, None)
        self._errors.pop(rid, None)

    def matcher(self, request):
        return self._matchers.get(request.request_id)

    # ---- per step -------------------------------------------------------------------------
    def fill_bitmask(self, requests):
        rows = [self._matchers.get(r.request_id) for r in requests]
        if not any(m is not None for m in rows):
            return None
        bitmask_tensor = self._bitmasks.next(len(requests))
        bitmask = bitmask_tensor.numpy()
        start = time.perf_counter()
        if self.row_workers is not None:
            self._build_missing_rows(rows)
        eos_off = []   # rows where EOS may not end the output yet
        check_eos = len(self._eos_words) > 0
        for i, m in enumerate(rows):
            if m is None:
                failed = requests[i].request_id in self._errors
                bitmask[i] = self._eos_only_row() if failed else -1
                continue
            try:
                m.fill_bitmask(bitmask, i)
            except Exception as exc:   # a lazy compile step failed: this request alone ends
                self._fail(requests[i].request_id, exc)
                bitmask[i] = self._eos_only_row()
                continue
            if check_eos and not (getattr(requests[i].sampling_params, "ignore_eos", False)
                                  or m.finished or m.is_complete()):
                eos_off.append(i)
        if eos_off:
            bitmask[np.ix_(eos_off, self._eos_words)] &= self._eos_keep
        self.mask_seconds += time.perf_counter() - start
        return bitmask_tensor

    def _build_missing_rows(self, matchers) -> None:
        """Rows of the states the batch reached for the first time, built side by side in
        the worker processes (two or more of one constraint; one is built in place), and
        the neighbourhoods of the states reached, asked for so their rows are built ahead."""
        workers = self.row_workers
        workers.poll()
        reached: dict[int, tuple] = {}
        for m in matchers:
            m = getattr(m, "inner", m)     # a wrapper (unique_items) over a regex matcher
            if type(m) is RegexMatcher and not m.finished and m.state >= 0:
                reached.setdefault(id(m.compiled), (m.compiled, set()))[1].add(m.state)
        for compiled, states in reached.values():
            missing = sorted(s for s in states if not compiled.has_row(s))
            if len(missing) >= 2:
                workers.build(compiled, missing)
            workers.expand(compiled, sorted(states))

    def close(self) -> None:
        """Stops the row worker processes, if any."""
        if self.row_workers is not None:
            self.row_workers.close()
            prefetch.set_enabled(self._prefetch_was)
            self.row_workers = None

    def _fail(self, rid, exc: Exception) -> None:
        message = f"structured output failed while decoding: {exc}"
        logger.error("request %s: %s", rid, message)
        self._errors[rid] = message
        self._matchers[rid] = None

    def _eos_only_row(self) -> np.ndarray:
        row = np.zeros(self.info.num_words * 32, dtype=bool)
        row[list(self.info.eos_token_ids)] = True
        return np.packbits(row, bitorder="little").view("<i4")

    def error(self, request) -> str | None:
        """Why a running request's constraint failed (its rows then allow EOS only), or None."""
        return self._errors.get(request.request_id)

    def stats(self) -> dict[str, float]:
        """Cumulative counters under EngineStats' field names."""
        return {"structured_output_compiles": self.compiler.num_compiles,
                "structured_output_cache_hits": self.compiler.num_cache_hits,
                "structured_output_compile_seconds": self.compiler.compile_seconds,
                "structured_output_mask_seconds": self.mask_seconds}

    def accept_token(self, request, token_id: int) -> bool:
        """Advances the request's matcher. A matcher that fails while advancing (a lazily
        built part of its grammar ran into a limit) fails its request alone, as in
        ``fill_bitmask``: False now, ``error`` set, EOS-only rows from then on."""
        m = self._matchers.get(request.request_id)
        if m is None:
            return True
        try:
            return m.accept(int(token_id))
        except Exception as exc:
            self._fail(request.request_id, exc)
            return False

    def is_terminated(self, request) -> bool:
        if request.request_id in self._errors:
            return True          # failed: EOS is the only way out
        m = self._matchers.get(request.request_id)
        return False if m is None else (m.finished or m.is_complete())

    def jump_forward_tokens(self, request) -> list[int]:
        m = self._matchers.get(request.request_id)
        if m is None:
            return []
        text = m.jump_forward()
        if not text:
            return []
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        accepted = []
        for tid in ids:
            if not m.accept(tid):
                break
            accepted.append(tid)
        # Hold back the last token unless the constraint is now finished: the text that
        # follows may merge with it into a better token (re-tokenization at the boundary).
        if accepted and not m.is_terminated():
            m.rollback(1)
            accepted.pop()
        return accepted


def _eos_clearing(eos_token_ids, num_words: int) -> tuple[np.ndarray, np.ndarray]:
    """The bitmask words holding EOS ids, and per word the int32 that clears their bits."""
    keep: dict[int, int] = {}
    for eos in eos_token_ids:
        word, bit = divmod(int(eos), 32)
        if word < num_words:
            keep[word] = keep.get(word, -1) & ~(1 << bit)
    words = np.asarray(sorted(keep), dtype=np.int64)
    masks = np.asarray([keep[w] for w in words], dtype=np.int64).astype(np.int32)
    return words, masks


class _BitmaskBuffers:
    """The host buffers ``fill_bitmask`` fills, two in turn, grown as batches grow.

    With ``pin_memory`` (a CUDA engine) they are page-locked, so the sampler's upload is an
    asynchronous copy straight from them, with no staging copy and no allocation a step.
    A buffer is filled again two calls after it was handed out: by then the engine has
    read the sampled ids of the step that uploaded it, so that upload is done."""

    def __init__(self, num_words: int, pin_memory: bool):
        self.num_words, self.pin_memory = num_words, pin_memory
        self._buffers = [None, None]
        self._turn = 0

    def next(self, rows: int):
        """An int32 tensor [rows, num_words] to fill (its contents are stale)."""
        import torch
        self._turn ^= 1
        buffer = self._buffers[self._turn]
        if buffer is None or buffer.shape[0] < rows:
            buffer = torch.empty((max(rows, 8), self.num_words), dtype=torch.int32,
                                 pin_memory=self.pin_memory)
            self._buffers[self._turn] = buffer
        return buffer[:rows]

