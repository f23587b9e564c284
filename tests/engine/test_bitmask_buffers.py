"""The manager's bitmask buffers: a mask handed out stays intact through the next fill
(the engine uploads it while the following step's masks are filled)."""
import torch

from tamis.engine.structured_output import _BitmaskBuffers


def test_a_mask_is_kept_through_the_next_fill():
    buffers = _BitmaskBuffers(num_words=4, pin_memory=False)
    first = buffers.next(3)
    first.fill_(7)
    second = buffers.next(3)
    second.fill_(-1)
    assert first.shape == second.shape == (3, 4)
    assert torch.all(first == 7), "the next fill must not write over the mask handed out last"
    third = buffers.next(5)                       # grown: a new buffer, the last one kept
    third.fill_(0)
    assert torch.all(second == -1) and third.shape == (5, 4)


def test_buffers_are_page_locked_on_cuda_engines():
    if not torch.cuda.is_available():
        buffers = _BitmaskBuffers(num_words=4, pin_memory=False)
        assert not buffers.next(2).is_pinned()
        return
    assert _BitmaskBuffers(num_words=4, pin_memory=True).next(2).is_pinned()
