"""TritonAttentionBackend (kernels under the interpreter on CPU) against the torch backend."""
from __future__ import annotations

import pytest
import torch

from tamis.engine.attention.metadata import AttentionMetadata
from tamis.engine.attention.torch_backend import TorchAttentionBackend
from tamis.engine.attention.triton_backend import TritonAttentionBackend


def _step(context_lens, query_lens, *, heads=4, kv_heads=2, dim=16, block_size=4, pad_tokens=0,
          dtype=torch.float32):
    """A step's metadata over scattered blocks; ``pad_tokens`` extra tokens with slot -1."""
    seq_lens = [c + q for c, q in zip(context_lens, query_lens)]
    blocks_per_seq = [-(-s // block_size) for s in seq_lens]
    num_blocks = sum(blocks_per_seq) + 2
    order = torch.randperm(num_blocks).tolist()
    tables = torch.zeros(len(seq_lens), max(blocks_per_seq), dtype=torch.int32)
    slots = []
    for b, n in enumerate(blocks_per_seq):
        tables[b, :n] = torch.tensor(order[:n])
        order = order[n:]
        for pos in range(context_lens[b], seq_lens[b]):
            slots.append(int(tables[b, pos // block_size]) * block_size + pos % block_size)
    slots += [-1] * pad_tokens
    qsl = torch.tensor([0] + query_lens, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    meta = AttentionMetadata(query_start_loc=qsl, seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
                             block_tables=tables, slot_mapping=torch.tensor(slots, dtype=torch.int64),
                             max_query_len=max(query_lens), max_seq_len=max(seq_lens),
                             block_size=block_size, query_lens_cpu=list(query_lens),
                             seq_lens_cpu=seq_lens)
    cache = torch.randn(2, num_blocks, block_size, kv_heads, dim, dtype=dtype)
    tokens = len(slots)
    q = torch.randn(tokens, heads, dim, dtype=dtype)
    k = torch.randn(tokens, kv_heads, dim, dtype=dtype)
    v = torch.randn(tokens, kv_heads, dim, dtype=dtype)
    return q, k, v, cache, meta


@pytest.mark.parametrize("contexts,queries,window", [
    ([0, 0], [9, 4], None),          # prefill
    ([5, 12, 0], [1, 7, 3], None),   # mixed: decode row + chunk over a prefix + prompt
    ([6, 9, 3, 0], [1, 1, 5, 4], 4),  # mixed: two leading decodes (decode kernel) + chunks
    ([0, 4, 7], [3, 1, 1], None),    # decodes after a prompt chunk: all through prefill
    ([6, 30, 2], [1, 1, 1], None),   # decode-only
    ([6, 30, 2], [1, 1, 1], 8),      # decode-only, sliding window
    ([10, 0], [6, 13], 5),           # prefill, sliding window
])
def test_backend_matches_torch_backend(contexts, queries, window):
    q, k, v, cache, meta = _step(contexts, queries)
    torch_cache = cache.clone()
    want = TorchAttentionBackend().forward(q, k, v, torch_cache, meta, 0.25, window)
    got = TritonAttentionBackend(decode_num_splits=2).forward(q, k, v, cache, meta, 0.25, window)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert torch.equal(cache, torch_cache), "both must store the same k/v"


def test_padding_tokens_are_not_stored():
    q, k, v, cache, meta = _step([3, 0], [2, 5], pad_tokens=3)
    # Padding tokens belong to no sequence: attend over the real T only.
    real = meta.query_start_loc[-1]
    before = cache.clone()
    TritonAttentionBackend().forward(q[:real], k, v, cache, meta, 0.25)
    written = (cache != before).any(dim=(0, 3, 4)).sum()
    assert written == 7, "exactly the 7 real tokens' slots change"


def test_without_cache_attends_over_new_tokens():
    q, k, v, _, meta = _step([0, 0], [5, 3])
    got = TritonAttentionBackend().forward(q, k, v, None, meta, 0.3)
    want = TorchAttentionBackend().forward(q, k, v, None, meta, 0.3)
    torch.testing.assert_close(got, want)


def test_leading_decodes():
    from tamis.engine.attention.triton_backend import leading_decodes
    assert leading_decodes([1, 1, 5, 1]) == 2
    assert leading_decodes([3, 1]) == 0
    assert leading_decodes([1, 1]) == 2
    assert leading_decodes([]) == 0


def test_factory_picks_triton_on_cuda_only():
    from tamis.engine.attention.backends import get_attention_backend
    assert get_attention_backend("triton", "cpu").name == "torch"
    if torch.cuda.is_available():
        assert get_attention_backend("auto", "cuda").name == "triton"
