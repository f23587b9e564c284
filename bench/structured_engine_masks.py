"""Mask fill time as the engine's step path sees it, during real constrained generation.

Used by ``bench_structured.py --engine-masks [--engine-masks-kind json|regex|grammar]``:
SmolLM2 on CPU, one batch of ``batch`` requests, temperature 1.0, one seed per request.
``json``: each request constrained by a *different* maskbench-dev schema (the first
``batch`` of the maskbench-dev sample that tamis compiles); ``regex``: each by a different
regex (``regexes``: eight families, each with its own bounds per request); ``grammar``: the
llama.cpp GBNF grammars of the conformance data, in turn (several requests share one
compiled grammar but walk it with their own samples). Every
automaton state is visited cold (no constrained warm-up pass; an unconstrained 8-token pass
warms the model). Every call of a matcher's ``fill_bitmask`` on the step path is timed
(wall clock: it includes any wait for the prefetch worker and for the GIL), and so is the
manager's whole per-step fill. Run once per prefetch setting, each in its own process
(``subprocess_runs.run_each``): caches start cold in both.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from conformance import maskbench_sample, smollm2

from tamis.constrain import ConstraintError, StructuredOutputsParams, compile_constraint
from tamis.constrain import deadline, prefetch
from tamis.constrain.grammar_matcher import GrammarMatcher
from tamis.constrain.matcher import RegexMatcher


def pick_schemas(count: int, per_subset: int) -> list[tuple[str, dict]]:
    """(name, schema) of the first ``count`` sample schemas tamis compiles (checked with a
    throwaway TokenizerInfo, so the engine's mask caches stay cold)."""
    _, info = smollm2()
    out = []
    for subset, path in maskbench_sample(per_subset):
        schema = json.loads(path.read_text())["schema"]
        try:
            with deadline.deadline(10):
                compile_constraint(StructuredOutputsParams(json=schema), info)
        except ConstraintError:
            continue
        out.append((f"{subset}/{path.stem}", schema))
        if len(out) == count:
            break
    return out


def regexes(count: int) -> list[tuple[str, str]]:
    """(name, pattern): ``count`` distinct regexes, eight families with bounds varied per index."""
    families = [
        lambda i: rf"(([a-z]{{2,{6 + i % 9}}}) ){{{10 + i}}}",
        lambda i: rf"[a-z0-9._]{{1,{8 + i}}}@[a-z]{{2,{6 + i % 5}}}\.(com|org|net|io)",
        lambda i: rf"(19|20)[0-9]{{2}}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])( [a-z]{{3,{5 + i}}}){{0,3}}",
        lambda i: r"((25[0-5]|2[0-4][0-9]|1?[0-9]?[0-9])\.){3}(25[0-5]|2[0-4][0-9]|1?[0-9]?[0-9])"
                  + rf"(:[0-9]{{1,{2 + i % 4}}})?",
        lambda i: rf"\+[1-9][0-9]{{0,2}} \(?[0-9]{{3}}\)? [0-9]{{3}}-[0-9]{{2,{4 + i}}}",
        lambda i: rf"[0-9a-f]{{8}}-[0-9a-f]{{4}}-[1-5][0-9a-f]{{3}}-[89ab][0-9a-f]{{3}}-[0-9a-f]{{{12 - i % 4}}}",
        lambda i: rf"(Yes|No|Maybe)(, because [A-Za-z ,]{{10,{40 + i}}})?\.",
        lambda i: rf"https?://[a-z]{{2,{10 + i % 7}}}(\.[a-z]{{2,8}}){{1,3}}(/[a-zA-Z0-9_-]{{1,{12 + i}}}){{0,4}}",
    ]
    return [(f"regex-{i}", families[i % len(families)](i // len(families))) for i in range(count)]


def grammars(count: int) -> list[tuple[str, str]]:
    """(name, GBNF text): the conformance llama.cpp grammars, in turn, ``count`` of them."""
    from conformance import CONFORMANCE
    folder = CONFORMANCE / "grammars/gbnf/llama.cpp-grammars"
    texts = [(path.stem, path.read_text()) for path in sorted(folder.glob("*.gbnf"))]
    return [texts[i % len(texts)] for i in range(count)]


def constraints(kind: str, count: int, per_subset: int) -> list[tuple[str, object]]:
    """(name, StructuredOutputsParams) for the batch."""
    if kind == "json":
        return [(name, StructuredOutputsParams(json=schema))
                for name, schema in pick_schemas(count, per_subset)]
    if kind == "regex":
        return [(name, StructuredOutputsParams(regex=pattern)) for name, pattern in regexes(count)]
    if kind == "grammar":
        return [(name, StructuredOutputsParams(grammar=text)) for name, text in grammars(count)]
    raise ValueError(f"unknown kind {kind!r}: json, regex or grammar")


def _time_class_method(cls, name: str, sink: list) -> None:
    inner = getattr(cls, name)

    def timed(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return inner(self, *args, **kwargs)
        finally:
            sink.append(time.perf_counter() - start)
    setattr(cls, name, timed)


def run(prefetch_on: bool, batch: int, max_tokens: int, per_subset: int, threads: int,
        kind: str = "json") -> dict:
    import torch
    torch.set_num_threads(threads)
    from tamis.engine.llm import LLM
    from tamis.engine.sampling_params import SamplingParams
    prefetch.set_enabled(prefetch_on)
    batch_constraints = constraints(kind, batch, per_subset)
    llm = LLM()
    llm.generate(["Hello"] * batch, SamplingParams(max_tokens=8, ignore_eos=True), use_tqdm=False)
    row_times: list = []
    step_times: list = []
    forward_times: list = []
    for cls in (RegexMatcher, GrammarMatcher):
        _time_class_method(cls, "fill_bitmask", row_times)
    engine = llm.llm_engine
    _time_class_method(type(engine._structured_manager()), "fill_bitmask", step_times)
    _time_class_method(type(engine.runner), "execute_model", forward_times)
    params = [SamplingParams(temperature=1.0, seed=i, max_tokens=max_tokens,
                             structured_outputs=constraint)
              for i, (_, constraint) in enumerate(batch_constraints)]
    what = "JSON value" if kind == "json" else f"{kind} match"
    prompts = [f"Write one {what} ({name}): " for name, _ in batch_constraints]
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    reasons: dict = {}
    for o in outputs:
        reasons[o.outputs[0].finish_reason] = reasons.get(o.outputs[0].finish_reason, 0) + 1
    return {"prefetch": "on" if prefetch_on else "off", "kind": kind,
            "requests": len(batch_constraints),
            "tokens": tokens, "seconds": elapsed, "tok/s": tokens / elapsed,
            "steps": len(forward_times), "finish": reasons,
            "row fills": len(row_times), "row_us": _percentiles(row_times),
            "rows over 300 us": sum(t > 3e-4 for t in row_times),
            "step fill ms": [v / 1e3 for v in _percentiles(step_times)],
            "fill total s": sum(step_times), "forward total s": sum(forward_times),
            "prefetch jobs": prefetch.WORKER.jobs_run}


def _percentiles(times: list) -> list[float]:
    """p50 / p90 / p99 / max in microseconds."""
    if not times:
        return [float("nan")] * 4
    return [1e6 * float(np.percentile(times, q)) for q in (50, 90, 99)] + [1e6 * max(times)]


def rows(results: list[dict]) -> list[str]:
    kind = results[0].get("kind", "json") if results else "json"
    out = [f"| engine step path, {kind} constraints | " + " | ".join(
        f"prefetch {r.get('prefetch', '?')}" for r in results) + " | target |",
           "|---|" + "---|" * len(results) + "---|"]

    def line(label, fmt, target=""):
        cells = []
        for r in results:
            cells.append(r["error"] if "error" in r else fmt(r))
        out.append(f"| {label} | " + " | ".join(cells) + f" | {target} |")
    line("requests / tokens / steps", lambda r: f"{r['requests']} / {r['tokens']} / {r['steps']}")
    line("matcher fill us p50 / p90 / p99 / max",
         lambda r: " / ".join(f"{v:,.0f}" for v in r["row_us"]), "<= 30 / - / <= 300")
    line("matcher fills over 300 us", lambda r: f"{r['rows over 300 us']}/{r['row fills']}")
    line("whole-batch fill per step ms p50 / p90 / p99 / max",
         lambda r: " / ".join(f"{v:.2f}" for v in r["step fill ms"]))
    line("fill total / forward total s", lambda r: f"{r['fill total s']:.2f} / {r['forward total s']:.1f}")
    line("wall s, tok/s", lambda r: f"{r['seconds']:.1f}, {r['tok/s']:.1f}")
    line("finish reasons", lambda r: json.dumps(r["finish"]))
    line("prefetch jobs run", lambda r: str(r["prefetch jobs"]))
    return out


def write_json(result: dict, path: str) -> None:
    Path(path).write_text(json.dumps(result))
