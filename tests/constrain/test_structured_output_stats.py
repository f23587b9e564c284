"""The structured-output counters the engine reports (and /metrics exports) move."""
from __future__ import annotations

from types import SimpleNamespace

from transformers import AutoTokenizer

from tamis.constrain import StructuredOutputsParams
from tamis.engine.structured_output import StructuredOutputManager


def _request(rid: str, choice: list[str]):
    params = SimpleNamespace(structured_outputs=StructuredOutputsParams(choice=choice))
    return SimpleNamespace(request_id=rid, sampling_params=params)


def test_compile_cache_and_mask_counters_move(smollm2_path):
    tokenizer = AutoTokenizer.from_pretrained(smollm2_path)
    manager = StructuredOutputManager(tokenizer, len(tokenizer))
    first, second = _request("a", ["yes", "no"]), _request("b", ["yes", "no"])
    manager.add_request(first)
    manager.add_request(second)            # same spec: served from the compile cache
    manager.compiler.compile(StructuredOutputsParams(choice=["yes", "no"]))
    assert manager.is_ready(first) and manager.is_ready(second)
    assert manager.fill_bitmask([first, second]) is not None

    stats = manager.stats()
    assert stats["structured_output_compiles"] == 1
    assert stats["structured_output_cache_hits"] == 2
    assert stats["structured_output_compile_seconds"] > 0.0
    assert stats["structured_output_mask_seconds"] > 0.0
