"""Structured-output benchmark (W4 of bench/RESULTS.md, model-free part + optional throughput).

    python bench/bench_structured.py [--data DIR] [--per-subset 40]
                                     [--backend tamis|xgrammar|llguidance|all]
                                     [--throughput [--batch 32 --max-tokens 64 --repeats 2
                                                    --no-jump-forward]]
                                     [--skip-maskbench] [--engine-masks] [--cpu-clock]
                                     [--slowest N]

- coverage, cold compile time and accept/reject agreement over the maskbench-dev
  schemas (``--data DIR``: the whole dev half, one folder per subset, from a checkout of
  the public jsonschemabench repository; without it, the 8-per-subset sample kept in
  tests/data/conformance) (up to N files per subset, sorted, ``random.Random(0).shuffle``); instances
  serialised compactly and walked token by token (SmolLM2 tokenizer), the mask filled at
  every step; the same sample and walk for every backend asked for (xgrammar / llguidance
  only where installed: ``tamis.constrain.backends``);
- per-step mask fill time p50/p99 for JSON schemas (those walks), a regex and a grammar
  (``--cpu-clock``: compiles and fills timed in the process's CPU time, which the other jobs
  of a shared machine do not stretch); ``--slowest N`` lists the N slowest compiles by
  subset and file;
- the cyclic garbage collector's pauses over those compiles and walks (full collections and
  their longest, the longest younger one), the start-up heap frozen first as the engine core
  process freezes its own;
- with ``--throughput``: constrained (JSON schema) vs unconstrained decode tokens/s at batch
  32 on CPU, SmolLM2, same prompts and max_tokens; unconstrained runs with ignore_eos and the
  schema cannot complete inside max_tokens, so both sides generate max_tokens per request
  (actual tokens are counted). A warm-up pass of each runs first; the reported figure is the
  median of ``--repeats`` alternating passes. Jump-forward lets the constrained side append
  forced tokens without sampling them (fewer engine steps); ``--no-jump-forward`` turns it off
  so both sides run the same steps, and "s per engine step" compares the steps themselves.
  Every pass reports where the time went (forward, bitmask fill with the EOS policy, bitmask
  apply, accept, jump-forward).
- with ``--engine-masks``: the mask fill time on the engine's step path during real
  constrained generation (``structured_engine_masks.py``: batch 32, each request its own
  maskbench schema, caches cold), once with the prefetch worker off and once on, each in
  its own process. The model-free walks above run with the worker off: every first visit
  is paid on the step path, with no forward pass to hide it behind (the worst case).
Prints markdown tables last.
"""
from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "constrain"))
from call_timing import time_calls  # noqa: E402
from conformance import CONFORMANCE, compact, in_schema_order, maskbench_sample, smollm2  # noqa: E402

from tamis.constrain import ConstraintError, StructuredOutputsParams  # noqa: E402
from tamis.constrain import backends as backend_registry  # noqa: E402
from tamis.constrain import deadline, prefetch  # noqa: E402

THROUGHPUT_SCHEMA = {
    "type": "object", "properties": {"items": {"type": "array", "minItems": 40, "items": {
        "type": "object", "properties": {"name": {"type": "string", "maxLength": 24},
                                         "qty": {"type": "integer", "minimum": 0, "maximum": 999},
                                         "ok": {"type": "boolean"}},
        "required": ["name", "qty", "ok"], "additionalProperties": False}}},
    "required": ["items"], "additionalProperties": False}


# ---- model-free: maskbench and mask fill ---------------------------------------------------

# Compiles and mask fills are timed by this clock; ``--cpu-clock`` makes it the process's
# CPU time, which other jobs on a shared machine do not stretch (the prefetch worker is off
# during the walks, so the process runs one thread of constraint work).
clock = time.perf_counter


def timed_walk(compiled, text: str, mask_times: list) -> bool:
    tokenizer, info = smollm2()
    matcher = compiled.matcher()
    bitmask = np.zeros((1, info.num_words), dtype=np.int32)
    for token in tokenizer.encode(text, add_special_tokens=False) + [info.eos_token_ids[0]]:
        start = clock()
        matcher.fill_bitmask(bitmask, 0)
        mask_times.append(clock() - start)
        if not matcher.accept(token):
            return False
    return True


def pct(values, q):
    return 1e3 * float(np.percentile(values, q)) if values else float("nan")


def compile_with(backend, params):
    """tamis compiles under its cooperative 10 s deadline; the others run native code that
    cannot be interrupted (none came near 10 s on this sample)."""
    with deadline.deadline(10):
        return backend.compile(params)


def maskbench(backend, per_subset: int, compiles: list | None = None):
    """Coverage rows per subset and the timings; with ``compiles`` (a list), appends
    (seconds, subset/file name) for every schema compiled."""
    per = defaultdict(Counter)
    compile_ms, first_mask_ms, mask_times, refused = [], [], [], Counter()
    for subset, path in maskbench_sample(per_subset):
        doc = json.loads(path.read_text())
        row = per[subset]
        row["schemas"] += 1
        start = clock()
        try:
            compiled = compile_with(backend, StructuredOutputsParams(json=doc["schema"]))
        except ConstraintError as exc:
            refused[str(exc)[:60]] += 1
            continue
        elapsed = clock() - start
        try:
            walked = walk_tests(compiled, doc["tests"], doc["schema"])
        except ConstraintError as exc:     # a lazy compile step failed at a mask: refused
            refused["(at a mask) " + str(exc)[:60]] += 1
            continue
        compile_ms.append(elapsed)
        if compiles is not None:
            compiles.append((elapsed, f"{subset}/{path.name}"))
        row["compiled"] += 1
        for kind, ok, times in walked:
            if times:
                first_mask_ms.append(times[0])
                mask_times += times[1:]
            row[kind] += 1
            row[kind + "_ok"] += ok
    return per, compile_ms, first_mask_ms, mask_times, refused


def walk_tests(compiled, tests, schema) -> list:
    """(kind, agrees with the test, mask times) per test, each instance serialised with its
    properties in the schema's order (tamis's generation order); raises a lazy ConstraintError."""
    out = []
    for test in tests:
        times: list = []
        accepted = timed_walk(compiled, compact(in_schema_order(test["data"], schema)), times)
        out.append(("valid" if test["valid"] else "invalid", accepted == test["valid"], times))
    return out


def regex_and_grammar_masks(backend):
    """name -> list of mask-fill seconds, or the compile error's text."""
    out = {}
    regex = StructuredOutputsParams(regex=r"(([a-z]{2,10}) ){20}")
    gbnf = (CONFORMANCE / "grammars/gbnf/llama.cpp-grammars/json.gbnf").read_text()
    text = compact({"name": "tamis", "tags": ["a", "bb", "ccc"], "n": [1, 2.5, -3e2],
                    "nested": {"ok": True, "none": None}})
    for name, params, sample in (("regex", regex, "lorem ipsum dolor sit amet " * 4),
                                 ("grammar (json.gbnf)", StructuredOutputsParams(grammar=gbnf), text)):
        try:
            compiled = compile_with(backend, params)
        except ConstraintError as exc:
            out[name] = str(exc)
            continue
        times: list = []
        for _ in range(3):              # first pass cold, then warm caches
            timed_walk(compiled, sample.strip()[:200], times)
        out[name] = times
    return out


def model_free_figures(name: str, per_subset: int, slowest: int = 0) -> dict[str, str]:
    prefetch.set_enabled(False)     # worst case: first visits paid on the step path
    tokenizer, info = smollm2()
    backend = backend_registry.load_backend(name, tokenizer, info.vocab_size, info)
    freeze_startup_heap()
    compiles: list = []
    with GcPauses() as pauses:
        per, compile_ms, first_mask, mask_times, refused = maskbench(backend, per_subset, compiles)
        others = regex_and_grammar_masks(backend)
    total = Counter()
    print(f"\n[{name}] subset                schemas compiled valid-accepted invalid-rejected")
    for subset, row in sorted(per.items()):
        total.update(row)
        print(f"{subset:34s} {row['schemas']:4d} {row['compiled']:8d} {row['valid_ok']:6d}/{row['valid']:<6d}"
              f" {row['invalid_ok']:6d}/{row['invalid']}")
    for message, count in refused.most_common(8):
        print(f"[{name}] refused x{count}: {message}")
    for seconds, schema in sorted(compiles, reverse=True)[:slowest]:
        print(f"[{name}] compile {1e3 * seconds:8.1f} ms  {schema}")
    fig = {
        "schemas compiled": f"{total['compiled']}/{total['schemas']} "
                            f"({100 * total['compiled'] / max(total['schemas'], 1):.1f}%)",
        "invalid instances accepted": f"{total['invalid'] - total['invalid_ok']}/{total['invalid']}",
        "valid instances accepted": f"{100 * total['valid_ok'] / max(total['valid'], 1):.1f}% "
                                    f"({total['valid_ok']}/{total['valid']})",
        "cold compile ms p50 / p99": f"{pct(compile_ms, 50):.1f} / {pct(compile_ms, 99):.1f}",
        "first mask after compile ms p50 / p99": f"{pct(first_mask, 50):.2f} / {pct(first_mask, 99):.1f}",
        "JSON mask fill us p50 / p99 / p99.9": mask_percentiles(mask_times),
        "garbage collections (compiles and walks) ms": pauses.summary(),
    }
    for other, times in others.items():
        fig[f"{other} mask fill us p50 / p99 / p99.9"] = (
            f"n/a: {times[:70]}" if isinstance(times, str) else mask_percentiles(times))
    return fig


class GcPauses:
    """Times every cyclic garbage collection while it is entered (``gc.callbacks``)."""

    def __init__(self):
        self.pauses: list[tuple[int, float]] = []       # (generation, seconds)
        self._started = 0.0

    def __enter__(self) -> "GcPauses":
        gc.callbacks.append(self._record)
        return self

    def __exit__(self, *exc) -> None:
        gc.callbacks.remove(self._record)

    def _record(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.pauses.append((info["generation"], time.perf_counter() - self._started))

    def summary(self) -> str:
        """'full: count / max ms; younger: max ms'."""
        full = [s for g, s in self.pauses if g == 2]
        young = [s for g, s in self.pauses if g < 2]
        return (f"full {len(full)} / max {1e3 * max(full, default=0):.0f}; "
                f"younger max {1e3 * max(young, default=0):.1f}")


def freeze_startup_heap() -> None:
    """What is loaded by now (transformers, the tokenizer, the backend) lives as long as the
    process: out of the cyclic collector's reach, as the engine core process puts its own
    start-up heap (``engine/core/process.py``), so that full collections during the walks
    rescan only what the constraints made."""
    gc.collect()
    gc.freeze()


def mask_percentiles(seconds: list) -> str:
    return " / ".join(f"{1e3 * pct(seconds, q):,.0f}" for q in (50, 99, 99.9))


# ---- with the model: constrained vs unconstrained decode throughput ------------------------

class HostTimers:
    """Wraps the engine's structured-output calls with timers (seconds, calls)."""

    def __init__(self):
        self.seconds = Counter()
        self.calls = Counter()

    def wrap(self, owner, attr: str, label: str) -> None:
        def add(seconds: float) -> None:
            self.seconds[label] += seconds
            self.calls[label] += 1
        time_calls(owner, attr, add)

    def reset(self) -> None:
        self.seconds.clear()
        self.calls.clear()


def _instrument(llm, jump_forward: bool) -> HostTimers:
    from tamis.engine import sampler as sampler_module
    timers = HostTimers()
    engine = llm.llm_engine
    manager = engine._structured_manager()
    if not jump_forward:        # every token sampled: both sides run the same number of steps
        manager.jump_forward_tokens = lambda request: []
    timers.wrap(manager, "fill_bitmask", "bitmask fill")
    timers.wrap(manager, "accept_token", "accept")
    timers.wrap(manager, "jump_forward_tokens", "jump-forward")
    timers.wrap(sampler_module, "apply_bitmask", "bitmask apply")
    timers.wrap(engine.runner, "execute_model", "forward (model)")
    return timers


def _one_pass(llm, constrained, batch: int, max_tokens: int, seed0: int, timers: HostTimers):
    from tamis.engine.sampling_params import SamplingParams
    so = StructuredOutputsParams(json=THROUGHPUT_SCHEMA) if constrained else None
    params = [SamplingParams(temperature=1.0, seed=seed0 + i, max_tokens=max_tokens,
                             ignore_eos=not constrained, structured_outputs=so) for i in range(batch)]
    prompts = [f"List {i} items as JSON: " for i in range(batch)]
    timers.reset()
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    bad = [o.outputs[0].finish_reason for o in outputs if o.outputs[0].finish_reason != "length"]
    steps = timers.calls["forward (model)"]
    return {"tokens": tokens, "seconds": elapsed, "tok/s": tokens / elapsed, "steps": steps,
            "s/step": elapsed / max(steps, 1),
            "timers": dict(timers.seconds), "calls": dict(timers.calls), "not_length": bad}


def throughput(backend: str, batch: int, max_tokens: int, repeats: int, threads: int,
               jump_forward: bool = True):
    import torch
    torch.set_num_threads(threads)
    from tamis.engine.llm import LLM
    llm = LLM(structured_outputs_backend=backend)
    timers = _instrument(llm, jump_forward)
    _one_pass(llm, False, batch, 8, 1000, timers)           # warm-up: compile, caches, allocator
    _one_pass(llm, True, batch, max_tokens, 1000, timers)
    runs = {"unconstrained": [], "json schema": []}
    for r in range(repeats):
        for name, constrained in (("unconstrained", False), ("json schema", True)):
            result = _one_pass(llm, constrained, batch, max_tokens, 100 * r, timers)
            runs[name].append(result)
            print(f"[throughput {backend}] pass {r} {name}: {result['tokens']} tokens, "
                  f"{result['steps']} steps in {result['seconds']:.2f}s = {result['tok/s']:.1f} tok/s; "
                  "host timers "
                  + ", ".join(f"{k} {v:.3f}s/{result['calls'][k]}" for k, v in result["timers"].items())
                  + (f"; finish != length: {result['not_length']}" if result["not_length"] else ""))
    return runs


def throughput_rows(backend: str, runs: dict) -> list[str]:
    median = {name: statistics.median(r["tok/s"] for r in rs) for name, rs in runs.items()}
    step = {name: statistics.median(r["s/step"] for r in rs) for name, rs in runs.items()}
    ratio = median["json schema"] / median["unconstrained"]
    rows = [f"| decode tok/s unconstrained / JSON ({backend}) | "
            f"{median['unconstrained']:.1f} / {median['json schema']:.1f} (ratio {ratio:.3f}) | >= 0.95 |",
            f"| s per engine step unconstrained / JSON ({backend}) | {step['unconstrained']:.3f} / "
            f"{step['json schema']:.3f} (ratio {step['unconstrained'] / step['json schema']:.3f}) | |"]
    for name, rs in runs.items():
        secs = Counter()
        for r in rs:
            secs.update(r["timers"])
        total = sum(r["seconds"] for r in rs)
        parts = ", ".join(f"{k} {100 * v / total:.1f}%" for k, v in sorted(secs.items()))
        rows.append(f"| {name} ({backend}): share of wall time | {parts} | |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default=None,
                        help="maskbench-dev folder, one subfolder per subset (default: the "
                             "sample in tests/data/conformance, 8 per subset)")
    parser.add_argument("--per-subset", type=int, default=40)
    parser.add_argument("--backend", default="tamis",
                        choices=("all",) + backend_registry.CHOICES,
                        help="'all' = tamis plus every installed yardstick")
    parser.add_argument("--skip-maskbench", action="store_true")
    parser.add_argument("--throughput", action="store_true")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (shared box: 1)")
    parser.add_argument("--no-jump-forward", action="store_true",
                        help="sample every constrained token (same steps as unconstrained)")
    parser.add_argument("--engine-masks", action="store_true",
                        help="step-path mask fill times in real generation, prefetch off and on")
    parser.add_argument("--engine-masks-kind", choices=("json", "regex", "grammar"),
                        default="json", help="the constraints of --engine-masks' batch")
    parser.add_argument("--cpu-clock", action="store_true",
                        help="time compiles and mask fills in process CPU time, not wall time")
    parser.add_argument("--slowest", type=int, default=0, metavar="N",
                        help="list the N slowest maskbench compiles (subset/file)")
    parser.add_argument("--prefetch", choices=("on", "off"), help=argparse.SUPPRESS)
    parser.add_argument("--json", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.data:
        import conformance
        conformance.MASKBENCH = Path(args.data).resolve()
    if args.prefetch:              # a child of --engine-masks
        import structured_engine_masks as engine_masks
        engine_masks.write_json(engine_masks.run(args.prefetch == "on", args.batch, args.max_tokens,
                                                 args.per_subset, args.threads,
                                                 args.engine_masks_kind), args.json)
        return
    if args.cpu_clock:
        global clock
        clock = time.process_time
    names = ([n for n in backend_registry.BACKENDS if backend_registry.is_installed(n)]
             if args.backend == "all" else [backend_registry.check_installed(args.backend)])
    smollm2()
    if not args.skip_maskbench:
        figures = {name: model_free_figures(name, args.per_subset, args.slowest) for name in names}
        print("\n| workload | " + " | ".join(names) + " | target |")
        print("|---|" + "---|" * len(names) + "---|")
        targets = {"schemas compiled": ">= 97%", "invalid instances accepted": "0",
                   "cold compile ms p50 / p99": "<= 5 / <= 100"}
        for row in figures[names[0]]:
            target = targets.get(row, "p99 <= 1,000, p99.9 <= 5,000" if "mask fill" in row else "")
            print(f"| {row} | " + " | ".join(figures[n][row] for n in names) + f" | {target} |")
    if args.engine_masks:
        import structured_engine_masks as engine_masks
        from subprocess_runs import run_each
        results = run_each(__file__, "--prefetch", ["off", "on"], "/tmp/tamis_engine_masks",
                           f"engine_masks_{args.engine_masks_kind}", "prefetch")
        print("\n" + "\n".join(engine_masks.rows(results)))
    if args.throughput:
        rows = []
        for name in names:
            runs = throughput(name, args.batch, args.max_tokens, args.repeats, args.threads,
                              not args.no_jump_forward)
            rows += throughput_rows(name, runs)
        print(f"\n| throughput (batch {args.batch}, max_tokens {args.max_tokens}, "
              f"{args.threads} thread(s), median of {args.repeats}"
              f"{', no jump-forward' if args.no_jump_forward else ''}) | value | target |\n|---|---|---|")
        print("\n".join(rows))


if __name__ == "__main__":
    main()
