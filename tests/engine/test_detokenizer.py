"""Incremental detokenization and stop rules on SmolLM2's tokenizer (byte-level BPE)."""
from __future__ import annotations

import pytest

from tamis.engine.detokenizer import IncrementalDetokenizer, check_token_stop
from tamis.engine.request import Request, RequestStatus
from tamis.engine.sampling_params import SamplingParams

TEXT = "Héllo wörld! 你好，世界 🎉🚀 naïve café — ok\n\tdone"


@pytest.fixture(scope="module")
def tokenizer(smollm2_path):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(smollm2_path)


def _feed(tokenizer, ids, params, prompt=(1, 2)):
    detok = IncrementalDetokenizer(tokenizer, list(prompt), params)
    pieces, stop = [], None
    for token in ids:
        before = detok.output_text
        stop = detok.update([token], stop_terminated=False)
        assert "\ufffd" not in detok.output_text                  # never half a character
        pieces.append(detok.output_text[len(before):])
        if stop:
            break
    return detok, pieces, stop


def test_incremental_text_equals_full_decode_with_multibyte(tokenizer):
    ids = tokenizer.encode(TEXT)
    assert any(len(tokenizer.decode([t])) == 1 and tokenizer.decode([t]) == "\ufffd" for t in ids)
    detok, pieces, _ = _feed(tokenizer, ids, SamplingParams())
    assert detok.output_text == tokenizer.decode(ids) == TEXT
    assert "".join(pieces) == TEXT


@pytest.mark.parametrize("include, expected", [(False, "Héllo wörld! 你好"), (True, "Héllo wörld! 你好，世界")])
def test_stop_string_truncates(tokenizer, include, expected):
    params = SamplingParams(stop=["，世界", "never"], include_stop_str_in_output=include)
    detok, _, stop = _feed(tokenizer, tokenizer.encode(TEXT), params)
    assert stop == "，世界" and detok.output_text == expected


def test_stop_string_across_tokens_and_hold_back(tokenizer):
    params = SamplingParams(stop=["rld!"])
    detok = IncrementalDetokenizer(tokenizer, [1], params)
    shown = []
    for token in tokenizer.encode(TEXT):
        stop = detok.update([token], False)
        shown.append(detok.get_output_text(finished=stop is not None))
        if stop:
            break
    assert detok.output_text == "Héllo wö"
    # While running, the last len(stop)-1 characters were never shown.
    assert all(not s.endswith("r") or s == "Héllo wö" for s in shown[:-1])
    assert shown[-1] == "Héllo wö"


def test_stop_strings_wait_for_min_tokens(tokenizer):
    ids = tokenizer.encode("a b a b a b")
    params = SamplingParams(stop=["a"], min_tokens=3)
    detok, _, stop = _feed(tokenizer, ids, params)
    # Tokens "a", " b", " a", ...: the matches inside the first 3 tokens do not count.
    assert stop == "a" and detok.output_text == "a b a b "


def test_special_tokens_and_stop_token_text(tokenizer):
    eos = tokenizer.eos_token_id
    ids = tokenizer.encode("Hi there") + [eos]
    for include, text in ((False, "Hi there"), (True, "Hi there")):
        params = SamplingParams(include_stop_str_in_output=include)
        detok = IncrementalDetokenizer(tokenizer, [1], params)
        detok.update(ids[:-1], False)
        detok.update([eos], True)
        assert detok.output_text == text                      # EOS is special: skipped
    params = SamplingParams(skip_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, [1], params)
    detok.update(ids, False)
    assert detok.output_text == "Hi there" + tokenizer.decode([eos])


def test_check_token_stop_rules():
    def request(params, outputs, prompt=(1, 2, 3)):
        r = Request("r", list(prompt), params)
        params.all_stop_token_ids |= {2} if not params.ignore_eos else set()
        for t in outputs:
            r.append_output_token(t)
        return r
    assert check_token_stop(request(SamplingParams(), [5, 2]), 100) == RequestStatus.FINISHED_STOPPED
    assert check_token_stop(request(SamplingParams(ignore_eos=True), [5, 2]), 100) is None
    r = request(SamplingParams(stop_token_ids=[9]), [9])
    assert check_token_stop(r, 100) == RequestStatus.FINISHED_STOPPED and r.stop_reason == 9
    assert check_token_stop(request(SamplingParams(min_tokens=3), [5, 2]), 100) is None
    assert check_token_stop(request(SamplingParams(max_tokens=2), [5, 6]), 100) == RequestStatus.FINISHED_LENGTH
    assert check_token_stop(request(SamplingParams(max_tokens=50), [5, 6]), 5) == RequestStatus.FINISHED_LENGTH


def test_detokenize_false_produces_no_text(tokenizer):
    detok = IncrementalDetokenizer(tokenizer, [1], SamplingParams(detokenize=False))
    detok.update(tokenizer.encode("hello"), False)
    assert detok.output_text == ""


def test_id_decoder_decodes_as_the_tokenizer_does(tokenizer):
    """The Rust tokenizer directly for a plain fast tokenizer: the same text as
    ``tokenizer.decode``, special tokens kept or skipped."""
    import copy
    import random

    from tamis.engine.tokenizer import id_decoder

    direct = copy.copy(tokenizer)
    direct.decode = None   # the direct path never calls transformers' wrapper
    decode = id_decoder(direct)
    rng = random.Random(0)
    special = sorted(tokenizer.all_special_ids)
    windows = [tokenizer.encode(TEXT)[3:9]] + [
        [rng.choice(special) if rng.random() < 0.2 else rng.randrange(len(tokenizer))
         for _ in range(rng.randint(1, 7))] for _ in range(500)]
    for ids in windows:
        for skip in (False, True):
            assert decode(ids, skip) == tokenizer.decode(ids, skip_special_tokens=skip)


def test_id_decoder_keeps_a_tokenizer_s_own_decode(tokenizer):
    """A class that overrides ``_decode`` (or cleans up spaces) is called as it is."""
    import copy

    from tamis.engine.tokenizer import id_decoder

    class Shouting(type(tokenizer)):
        def _decode(self, token_ids, skip_special_tokens=False, **kwargs):
            return super()._decode(token_ids, skip_special_tokens, **kwargs).upper()

    shouting = copy.copy(tokenizer)
    shouting.__class__ = Shouting
    assert id_decoder(shouting)(tokenizer.encode("ok"), False) == "OK"
    cleaning = copy.copy(tokenizer)
    cleaning.clean_up_tokenization_spaces = True
    calls = []
    cleaning.decode = lambda ids, **kw: calls.append(ids) or "x"
    assert id_decoder(cleaning)([1], False) == "x" and calls == [[1]]
