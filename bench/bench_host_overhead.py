"""Host (CPU) work per engine step, measured on CPU with a tiny model (no GPU needed).

W1's shape at a tiny scale: 256 concurrent requests, prompts of 128-1024 random token
ids, 256 output tokens each, EOS ignored, greedy, ``LLM.generate`` (FINAL_ONLY
outputs). The model is a random 2-layer Llama (hidden 64, vocabulary 1,024) so the
device phases are cheap and the host phases stand out. The engine runs the GPU
runner (``GPUModelRunner``: numpy batch layout, step buffers) on CPU, eagerly.

    python bench/bench_host_overhead.py                  # W1 shape, token ids only
    python bench/bench_host_overhead.py --text           # + tokenizer, detokenized text
    python bench/bench_host_overhead.py --forward real   # the tiny model's real forward

``--forward stub`` (default) replaces the transformer by an embedding lookup: the
hidden state of a token is its embedding, so logits (and sampled tokens) still vary.
The real forward adds the CPU attention's cost to "forward", which is the GPU's work
on the H200; the host phases do not change.

Printed: mean ms per decode step with the full batch (every request decoding), per
phase, in CPU time of the engine's thread by default (``--clock wall`` for wall time). Phases are the wall time inside ``scheduler.schedule``, ``runner.prepare_inputs``,
``runner.forward``, ``runner.compute_logits``, ``runner.sample``; ``other`` is the rest
of ``engine.step`` (appending tokens, stop checks, detokenization, outputs). Timings
on a shared machine are noisy: compare runs taken back to back.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))
from llama8b import add_w1_workload_args, make_prompts  # noqa: E402

PHASES = (("scheduler", "schedule"), ("runner", "prepare_inputs"), ("runner", "forward"),
          ("runner", "compute_logits"), ("runner", "sample"))


def make_checkpoint(folder: Path, vocab: int, with_tokenizer: bool) -> Path:
    from tiny_models import make_tiny_checkpoint
    return make_tiny_checkpoint("llama", folder, with_tokenizer=with_tokenizer,
                                vocab_size=vocab, max_position_embeddings=4096)


def make_engine(path: Path, args):
    """An LLM whose engine uses the GPU runner on CPU (eager: no CUDA graphs)."""
    from tamis.engine import engine as engine_module
    from tamis.engine.gpu_runner import GPUModelRunner
    from tamis.engine.llm import LLM
    saved = engine_module.make_runner
    engine_module.make_runner = GPUModelRunner
    try:
        llm = LLM(model=str(path), dtype="float32", enforce_eager=True, device="cpu",
                  max_num_seqs=args.num_prompts, max_num_batched_tokens=args.max_batched_tokens,
                  max_model_len=2048, kv_cache_memory_bytes="256MiB",
                  skip_tokenizer_init=not args.text, enable_prefix_caching=True)
    finally:
        engine_module.make_runner = saved
    if args.forward == "stub":
        stub_forward(llm.llm_engine.runner)
    return llm


def stub_forward(runner) -> None:
    """forward(inputs) -> the input tokens' embeddings (no attention, no MLP)."""
    embed = runner.model.model.embed_tokens

    def forward(inputs):
        return embed(inputs.input_ids)
    runner.forward = forward


class PhaseTimer:
    """Time per phase of each ``engine.step``; keeps the decode steps at full batch.
    ``clock``: ``time.thread_time`` (CPU time of this thread: steadier on a loaded
    machine) or ``time.perf_counter`` (wall)."""

    def __init__(self, engine, batch: int, clock=time.thread_time):
        self.clock = clock
        self.batch = batch
        self.steps: list[dict] = []
        self.current: dict = {}
        owners = {"scheduler": engine.scheduler, "runner": engine.runner}
        for owner, name in PHASES:
            self._wrap(owners[owner], name)
        self._wrap_step(engine)

    def _wrap(self, obj, name: str) -> None:
        inner = getattr(obj, name)

        def timed(*a, **k):
            t0 = self.clock()
            out = inner(*a, **k)
            self.current[name] = self.current.get(name, 0.0) + self.clock() - t0
            if name == "schedule":
                self.current["decode_batch"] = _decode_batch_size(out)
            return out
        setattr(obj, name, timed)

    def _wrap_step(self, engine) -> None:
        step = engine.step

        def timed_step():
            self.current = {}
            t0 = self.clock()
            out = step()
            self.current["step"] = self.clock() - t0
            self.steps.append(self.current)
            return out
        engine.step = timed_step

    def summary(self) -> dict:
        full = [s for s in self.steps if s.get("decode_batch") == self.batch]
        row = {"full_batch_decode_steps": len(full), "all_steps": len(self.steps)}
        if not full:
            return row
        names = [name for _, name in PHASES]
        for name in names + ["step"]:
            row[f"{name}_ms"] = round(1e3 * sum(s.get(name, 0.0) for s in full) / len(full), 3)
        row["other_ms"] = round(row["step_ms"] - sum(row[f"{n}_ms"] for n in names), 3)
        row["host_ms"] = round(row["step_ms"] - row["forward_ms"] - row["compute_logits_ms"], 3)
        return row


def _decode_batch_size(batch) -> int | None:
    """Number of requests when every scheduled request decodes one token, else None."""
    items = batch.scheduled
    if items and all(item.num_new_tokens == 1 for item in items):
        return len(items)
    return None


def run(args) -> dict:
    from tamis.engine.sampling_params import SamplingParams
    torch.set_num_threads(args.threads)
    folder = Path(tempfile.mkdtemp(prefix="tamis-host-bench-"))
    llm = make_engine(make_checkpoint(folder, args.vocab, args.text), args)
    params = SamplingParams(max_tokens=args.output_len, temperature=0.0, ignore_eos=True,
                            detokenize=args.text)
    warm = make_prompts(8, 16, 64, args.seed + 1, args.vocab, first_id=3)
    llm.generate([{"prompt_token_ids": p} for p in warm], params, use_tqdm=False)
    prompts = make_prompts(args.num_prompts, args.min_prompt, args.max_prompt, args.seed, args.vocab,
                           first_id=3)
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    timer = PhaseTimer(llm.llm_engine, args.num_prompts, clock)
    t0 = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    elapsed = time.perf_counter() - t0
    generated = sum(len(o.outputs[0].token_ids) for o in outs)
    result = dict(seconds=round(elapsed, 3), output_tokens=generated, clock=args.clock,
                  async_scheduling=getattr(llm.llm_engine, "async_scheduling", None), **timer.summary())
    if args.dump_tokens:
        Path(args.dump_tokens).write_text(json.dumps(
            [[o.outputs[0].token_ids, o.outputs[0].text] for o in outs]))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_w1_workload_args(parser)
    parser.add_argument("--max-batched-tokens", type=int, default=8192)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--forward", choices=("stub", "real"), default="stub")
    parser.add_argument("--text", action="store_true", help="load the tokenizer and detokenize")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu",
                        help="cpu: this thread's CPU time (steadier on a shared machine)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dump-tokens", help="write every output's token ids and text (JSON)")
    args = parser.parse_args()
    result = run(args)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
