"""What the constraint layer needs to know about a tokenizer, and nothing else.

``TokenizerInfo`` holds, per token id, the bytes the token stands for (``None`` for special
tokens and ids past the tokenizer, which are never allowed inside a constraint), the EOS ids,
and ``vocab_size`` = the width of the logits (may exceed the tokenizer's length: padding rows).

Token bytes are recovered from the vocabulary strings:
- byte-level BPE (GPT-2 style, e.g. SmolLM2): every character maps back to one byte through
  GPT-2's ``bytes_to_unicode`` table;
- SentencePiece style: ``▁`` is a space and ``<0xXX>`` is the raw byte XX.

It also builds the vocabulary table (``TokenTable``: token bytes as a padded matrix, buckets
by first byte) the mask computation walks; it is the ``trie`` attribute (historical name).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field

_CACHE: dict = {}
_CACHE_LOCK = threading.Lock()


def gpt2_bytes_to_unicode() -> dict[int, str]:
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) \
        + list(range(ord("®"), ord("ÿ") + 1))
    codes, extra = printable[:], 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            codes.append(256 + extra)
            extra += 1
    return dict(zip(printable, map(chr, codes)))


@dataclass
class TokenizerInfo:
    token_bytes: list            # list[bytes | None], length vocab_size
    eos_token_ids: tuple
    vocab_size: int
    name: str = ""
    trie: "TokenTable" = field(default=None, repr=False)

    def __post_init__(self):
        if len(self.token_bytes) != self.vocab_size:
            raise ValueError("token_bytes must have one entry per logit column (vocab_size)")
        if not self.eos_token_ids:
            raise ValueError("a tokenizer without an EOS token cannot end a constrained output")
        from .token_table import TokenTable
        self.trie = TokenTable(self.token_bytes)

    @property
    def num_words(self) -> int:
        """Width of one bitmask row in int32 words: ceil(vocab_size / 32)."""
        return (self.vocab_size + 31) // 32

    @property
    def cache_key(self) -> tuple:
        return (self.name, self.vocab_size, self.eos_token_ids, len(self.token_bytes))

    @classmethod
    def from_hf(cls, tokenizer, vocab_size: int | None = None,
                eos_token_ids=None) -> "TokenizerInfo":
        """Builds (once per tokenizer and width, then cached) from a transformers tokenizer."""
        key = (id(tokenizer), getattr(tokenizer, "name_or_path", ""), vocab_size,
               tuple(eos_token_ids or ()))
        with _CACHE_LOCK:
            cached = _CACHE.get(key)
            if cached is not None:
                return cached
        info = _from_hf(tokenizer, vocab_size, eos_token_ids)
        with _CACHE_LOCK:
            _CACHE[key] = info
        return info


def _from_hf(tokenizer, vocab_size, eos_token_ids) -> TokenizerInfo:
    vocab = tokenizer.get_vocab()
    width = max(vocab_size or 0, max(vocab.values()) + 1)
    if vocab_size is not None and vocab_size < max(vocab.values()) + 1:
        raise ValueError(f"vocab_size={vocab_size} is smaller than the tokenizer "
                         f"({max(vocab.values()) + 1} ids): it must be the logits width")
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    for tid, added in (getattr(tokenizer, "added_tokens_decoder", {}) or {}).items():
        if getattr(added, "special", False):
            special.add(int(tid))
    decode = _byte_decoder(vocab)
    token_bytes: list = [None] * width
    for text, tid in vocab.items():
        if tid not in special:
            token_bytes[tid] = decode(text)
    if eos_token_ids is None:
        eos_token_ids = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    return TokenizerInfo(token_bytes, tuple(sorted(set(eos_token_ids))), width,
                         name=str(getattr(tokenizer, "name_or_path", "")))


def _byte_decoder(vocab: dict):
    """Chooses byte-level BPE or SentencePiece decoding by looking at the vocabulary."""
    byte_level = sum(1 for t in vocab if "Ġ" in t or "Ċ" in t) > 10
    if byte_level:
        table = {c: b for b, c in gpt2_bytes_to_unicode().items()}

        def decode_byte_level(text: str):
            try:
                return bytes(table[c] for c in text)
            except KeyError:      # an added (non-special) token written in plain text
                return text.encode("utf-8")
        return decode_byte_level

    def decode_sentencepiece(text: str):
        if len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
            return bytes([int(text[3:5], 16)])
        return text.replace("▁", " ").encode("utf-8")
    return decode_sentencepiece
