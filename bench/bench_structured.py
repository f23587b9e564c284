"""Structured-output benchmark (BENCHMARKS.md W4, model-free part + optional throughput).

    python bench/bench_structured.py [--per-subset 40] [--throughput]

- coverage, cold compile time and accept/reject agreement over the maskbench-dev sample of
  BENCHMARKS.md (up to N files per subset, sorted, ``random.Random(0).shuffle``); instances
  serialised compactly and walked token by token (SmolLM2 tokenizer), the mask filled at
  every step;
- per-step mask fill time p50/p99 for JSON schemas (those walks), a regex and a grammar;
- with ``--throughput``: constrained vs unconstrained decode tokens/s at batch 32 on CPU.
Prints a table last.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "constrain"))
from conformance import CONFORMANCE, compact, maskbench_sample, smollm2  # noqa: E402

from tamis.constrain import ConstraintError, StructuredOutputsParams, compile_constraint  # noqa: E402
from tamis.constrain import deadline  # noqa: E402


def timed_walk(compiled, text: str, mask_times: list) -> bool:
    tokenizer, info = smollm2()
    matcher = compiled.matcher()
    bitmask = np.zeros((1, info.num_words), dtype=np.int32)
    for token in tokenizer.encode(text, add_special_tokens=False) + [info.eos_token_ids[0]]:
        start = time.perf_counter()
        matcher.fill_bitmask(bitmask, 0)
        mask_times.append(time.perf_counter() - start)
        if not matcher.accept(token):
            return False
    return True


def pct(values, q):
    return 1e3 * float(np.percentile(values, q)) if values else float("nan")


def maskbench(per_subset: int):
    _, info = smollm2()
    per = defaultdict(Counter)
    compile_ms, first_mask_ms, mask_times = [], [], []
    for subset, path in maskbench_sample(per_subset):
        doc = json.loads(path.read_text())
        row = per[subset]
        row["schemas"] += 1
        start = time.perf_counter()
        try:
            with deadline.deadline(10):
                compiled = compile_constraint(StructuredOutputsParams(json=doc["schema"]), info)
        except ConstraintError:
            continue
        compile_ms.append(time.perf_counter() - start)
        row["compiled"] += 1
        for test in doc["tests"]:
            times: list = []
            accepted = timed_walk(compiled, compact(test["data"]), times)
            if times:
                first_mask_ms.append(times[0])
                mask_times += times[1:]
            kind = "valid" if test["valid"] else "invalid"
            row[kind] += 1
            row[kind + "_ok"] += accepted == test["valid"]
    return per, compile_ms, first_mask_ms, mask_times


def regex_and_grammar_masks():
    _, info = smollm2()
    out = {}
    regex = StructuredOutputsParams(regex=r"(([a-z]{2,10}) ){20}")
    gbnf = (CONFORMANCE / "grammars/gbnf/llama.cpp-grammars/json.gbnf").read_text()
    text = compact({"name": "tamis", "tags": ["a", "bb", "ccc"], "n": [1, 2.5, -3e2],
                    "nested": {"ok": True, "none": None}})
    for name, params, sample in (("regex", regex, "lorem ipsum dolor sit amet " * 4),
                                 ("grammar (json.gbnf)", StructuredOutputsParams(grammar=gbnf), text)):
        compiled = compile_constraint(params, info)
        times: list = []
        for _ in range(3):              # first pass cold, then warm caches
            timed_walk(compiled, sample.strip()[:200], times)
        out[name] = times
    return out


def throughput(batch: int = 32, max_tokens: int = 64):
    import torch
    torch.set_num_threads(2)
    from tamis.engine.llm import LLM
    from tamis.engine.sampling_params import SamplingParams
    llm = LLM()
    schema = {"type": "object", "properties": {"items": {"type": "array", "minItems": 40, "items": {
        "type": "object", "properties": {"name": {"type": "string", "maxLength": 24},
                                         "qty": {"type": "integer", "minimum": 0, "maximum": 999},
                                         "ok": {"type": "boolean"}},
        "required": ["name", "qty", "ok"], "additionalProperties": False}}},
        "required": ["items"], "additionalProperties": False}
    results = {}
    for name, so in (("unconstrained", None), ("json schema", StructuredOutputsParams(json=schema))):
        params = [SamplingParams(temperature=1.0, seed=i, max_tokens=max_tokens, ignore_eos=so is None,
                                 structured_outputs=so) for i in range(batch)]
        prompts = [f"List {i} items as JSON: " for i in range(batch)]
        start = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        elapsed = time.perf_counter() - start
        tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
        results[name] = tokens / elapsed
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--per-subset", type=int, default=40)
    parser.add_argument("--throughput", action="store_true")
    args = parser.parse_args()
    smollm2()
    per, compile_ms, first_mask, mask_times = maskbench(args.per_subset)
    others = regex_and_grammar_masks()
    total = Counter()
    print("subset                     schemas compiled valid-accepted invalid-rejected")
    for subset, row in sorted(per.items()):
        total.update(row)
        print(f"{subset:26s} {row['schemas']:7d} {row['compiled']:8d} {row['valid_ok']:6d}/{row['valid']:<6d}"
              f" {row['invalid_ok']:6d}/{row['invalid']}")
    print("\n| workload | tamis | target |\n|---|---|---|")
    print(f"| schemas compiled | {total['compiled']}/{total['schemas']} "
          f"({100 * total['compiled'] / max(total['schemas'], 1):.1f}%) | >= 99% |")
    print(f"| invalid instances accepted | {total['invalid'] - total['invalid_ok']}/{total['invalid']} | 0 |")
    print(f"| valid instances accepted | {100 * total['valid_ok'] / max(total['valid'], 1):.1f}% | >= 99% |")
    print(f"| cold compile ms p50 / p99 | {pct(compile_ms, 50):.1f} / {pct(compile_ms, 99):.1f} | <= 20 (p50) |")
    print(f"| first mask after compile ms p50 / p99 | {pct(first_mask, 50):.1f} / {pct(first_mask, 99):.1f} | |")
    print(f"| JSON mask fill us p50 / p99 | {1e3 * pct(mask_times, 50):.0f} / {1e3 * pct(mask_times, 99):.0f} "
          f"| <= 30 / <= 300 |")
    for name, times in others.items():
        print(f"| {name} mask fill us p50 / p99 | {1e3 * pct(times, 50):.0f} / {1e3 * pct(times, 99):.0f} "
              f"| <= 30 / <= 300 |")
    if args.throughput:
        tput = throughput()
        ratio = tput["json schema"] / tput["unconstrained"]
        print(f"| decode tok/s batch 32 unconstrained / JSON | {tput['unconstrained']:.1f} / "
              f"{tput['json schema']:.1f} (ratio {ratio:.2f}) | ratio >= 0.95 |")


if __name__ == "__main__":
    main()
