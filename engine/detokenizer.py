"""Incremental detokenization and stop conditions.

Text grows by decoding a short window of ids, never the whole output::

    ids:  [ctx ctx ctx | o0 o1 o2 o3]
           ^prefix_offset  ^read_offset
    new text = decode(ids[prefix:]) minus decode(ids[prefix:read])

The window starts with the last prompt tokens so tokenizers that drop a leading space
on the first token (SentencePiece) still produce the right text. A window ending in an
incomplete UTF-8 sequence decodes to U+FFFD; its text is held back until the bytes
complete, so multi-byte characters come out exactly once, whole.

Stop strings are searched only in the tail the new text could complete. While a
request is running, the last ``max(len(stop)) - 1`` characters are held back from the
reported text (when stop strings are excluded) so a stream never shows text a stop
string later removes.
"""
from __future__ import annotations

from typing import Any

from tamis.engine.request import Request, RequestStatus
from tamis.engine.sampling_params import SamplingParams
from tamis.engine.tokenizer import id_decoder

_CONTEXT_TOKENS = 5   # prompt tokens kept as decoding context (vLLM's initial offset)
_INCOMPLETE = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Any, prompt_token_ids: list[int], params: SamplingParams) -> None:
        self.tokenizer = tokenizer
        self.params = params
        self._decode = id_decoder(tokenizer)
        self.output_text = ""
        self._ids = list(prompt_token_ids[-_CONTEXT_TOKENS:])
        self._prefix_offset = 0
        self._read_offset = len(self._ids)
        self._num_output_tokens = 0
        self._hold_back = (max(len(s) for s in params.stop) - 1
                           if params.stop and not params.include_stop_str_in_output else 0)

    def update(self, new_token_ids: list[int], stop_terminated: bool) -> str | None:
        """Adds the text of ``new_token_ids``; returns the stop string that matched, if any
        (the text is then already truncated). ``stop_terminated``: the last id is EOS or a
        stop token id, whose text is left out unless ``include_stop_str_in_output``."""
        if not self.params.detokenize:
            return None
        skip_last = stop_terminated and not self.params.include_stop_str_in_output
        to_decode = new_token_ids[:-1] if skip_last else new_token_ids
        num_new_chars = 0
        for token_id in to_decode:
            num_new_chars += self._append(token_id)
        self._num_output_tokens += len(new_token_ids)
        if not self.params.stop or self._num_output_tokens <= self.params.min_tokens:
            return None
        return self._check_stop_strings(num_new_chars)

    def get_output_text(self, finished: bool) -> str:
        """The text to report now: everything when finished, else minus the held-back tail."""
        if finished or not self._hold_back:
            return self.output_text
        return self.output_text[:max(0, len(self.output_text) - self._hold_back)]

    def _append(self, token_id: int) -> int:
        self._ids.append(token_id)
        skip = self.params.skip_special_tokens
        prefix_text = self._decode(self._ids[self._prefix_offset:self._read_offset], skip)
        new_text = self._decode(self._ids[self._prefix_offset:], skip)
        if len(new_text) <= len(prefix_text) or new_text.endswith(_INCOMPLETE):
            return 0   # an incomplete character (or nothing visible) so far
        delta = new_text[len(prefix_text):]
        self.output_text += delta
        self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
        return len(delta)

    def _check_stop_strings(self, num_new_chars: int) -> str | None:
        if num_new_chars == 0:
            return None
        text = self.output_text
        for stop in self.params.stop:
            # Only a match ending inside the new characters is new.
            start = max(0, len(text) - num_new_chars - len(stop) + 1)
            index = text.find(stop, start)
            if index == -1:
                continue
            end = index + len(stop) if self.params.include_stop_str_in_output else index
            self.output_text = text[:end]
            return stop
        return None


def check_token_stop(request: Request, max_model_len: int) -> RequestStatus | None:
    """Token-level stops after ``request``'s last token: EOS (unless ``ignore_eos``) and
    ``stop_token_ids`` once ``min_tokens`` are out, then ``max_tokens`` and the context
    length. Sets ``request.stop_reason`` for a stop token id; returns the finished status."""
    params = request.sampling_params
    last = request.output_token_ids[-1]
    if request.num_output_tokens >= params.min_tokens and last in params.all_stop_token_ids:
        if last in params.stop_token_ids:
            request.stop_reason = last
        return RequestStatus.FINISHED_STOPPED
    if params.max_tokens is not None and request.num_output_tokens >= params.max_tokens:
        return RequestStatus.FINISHED_LENGTH
    if request.num_tokens >= max_model_len:
        return RequestStatus.FINISHED_LENGTH
    return None


__all__ = ["IncrementalDetokenizer", "check_token_stop"]
