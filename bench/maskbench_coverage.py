"""JSON-schema coverage on ALL maskbench-dev schemas (model-free), with refusal reasons.

    python bench/maskbench_coverage.py --data DIR [--jobs 2] [--out /tmp/maskbench.jsonl]
                                       [--limit N] [--every K] [--only FILE] [--compile-only]

DIR holds the maskbench-dev schemas, one folder per subset (a checkout of the public
jsonschemabench repository, its maskbench data grouped by subset); without ``--data`` the
168-schema sample kept in tests/data/conformance is measured.

Every schema is compiled (``compile_constraint``, SmolLM2 tokenizer, 10 s limit) and each of
its test instances is walked token by token (compact JSON, then EOS) through a fresh matcher:
"valid accepted" and "invalid accepted" are counted per subset. Schemas run in worker
processes (``--jobs``, interleaved split) under a 4 GiB address-space limit; a worker silent
for 60 s is killed and its schema counted as a timeout, then it resumes with the next one.
Prints coverage per subset and overall, the valid-accepted share, every accepted-invalid
instance, and the refusal reasons tallied by keyword. ``--only FILE`` measures the schema paths
listed in FILE (one a line, e.g. the refused ones of an earlier run, which ``--refused`` prints
from ``--out`` files); ``--compile-only`` skips the instance walks (coverage and reasons only).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "constrain"))
SILENT_LIMIT_S = 60


def all_schemas() -> list[str]:
    from conformance import MASKBENCH
    return [str(f) for sub in sorted(p for p in MASKBENCH.iterdir() if p.is_dir())
            for f in sorted(sub.glob("*.json"))]


def reason_of(exc: Exception) -> str:
    """The refusal tallied by keyword where the message names one."""
    msg = str(exc)
    m = re.search(r"keyword '(\w+)'|format '([^']*)'|(remote \$ref)", msg)
    if not m:
        return msg[:90]
    return m.group(1) or (f"format:{m.group(2)}" if m.group(2) else m.group(3))


def worker(list_file: str, start: int, out_file: str, walk_instances: bool = True) -> None:
    """Processes schemas from index ``start``; writes a "start" line then a result line each."""
    import resource
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
    from conformance import compact, in_schema_order, smollm2, walk
    from tamis.constrain import ConstraintError, StructuredOutputsParams, compile_constraint, deadline
    _, info = smollm2()
    paths = Path(list_file).read_text().split("\n")
    with open(out_file, "a") as out:
        for i in range(start, len(paths)):
            out.write(json.dumps({"i": i, "start": paths[i]}) + "\n")
            out.flush()
            doc = json.loads(Path(paths[i]).read_text())
            row = {"i": i, "path": paths[i], "reason": None}
            try:
                with deadline.deadline(10):
                    compiled = compile_constraint(StructuredOutputsParams(json=doc["schema"]), info)
            except (ConstraintError, MemoryError) as exc:
                row["reason"] = reason_of(exc) if isinstance(exc, ConstraintError) else "MemoryError"
                compiled = None
            if compiled is not None and walk_instances:
                row.update(valid=0, valid_ok=0, invalid=0, invalid_accepted=[])
                for k, test in enumerate(doc["tests"]):
                    try:
                        accepted = walk(compiled, compact(in_schema_order(test["data"],
                                                                          doc["schema"])))[0]
                    except ConstraintError as exc:   # a lazily built part ran into a limit
                        row["reason"] = f"while walking: {reason_of(exc)}"
                        accepted = False
                    if test["valid"]:
                        row["valid"] += 1
                        row["valid_ok"] += accepted
                    else:
                        row["invalid"] += 1
                        if accepted:
                            row["invalid_accepted"].append(k)
            out.write(json.dumps(row) + "\n")
            out.flush()


def supervise(paths: list[str], out_file: str, walk_instances: bool) -> None:
    """Runs workers over ``paths`` until every schema has a result line."""
    list_file = out_file + ".paths"
    Path(list_file).write_text("\n".join(paths))
    start = 0
    while start < len(paths):
        proc = subprocess.Popen([sys.executable, __file__, "--worker", list_file, str(start), out_file,
                                 str(int(walk_instances))])
        last, last_t = None, time.time()
        while proc.poll() is None:
            time.sleep(2)
            lines = Path(out_file).read_text().splitlines() if os.path.exists(out_file) else []
            current = lines[-1] if lines else None
            if current != last:
                last, last_t = current, time.time()
            elif time.time() - last_t > (SILENT_LIMIT_S if last else 3 * SILENT_LIMIT_S):
                proc.kill()
                proc.wait()
        rows = [json.loads(line) for line in Path(out_file).read_text().splitlines()]
        done = {r["i"] for r in rows if "path" in r}
        starts = [r for r in rows if "start" in r]
        if not starts or len(done) >= len(paths):
            break
        current = starts[-1]
        if current["i"] not in done:
            with open(out_file, "a") as out:
                out.write(json.dumps({"i": current["i"], "path": current["start"],
                                      "reason": f"timeout or crash (rc={proc.returncode})"}) + "\n")
        start = current["i"] + 1


def report(out_files: list[str]) -> None:
    rows = {}
    for name in out_files:
        for line in Path(name).read_text().splitlines():
            row = json.loads(line)
            if "path" in row:
                rows[row["path"]] = row
    per, reasons, examples, bad = defaultdict(Counter), Counter(), {}, []
    for row in rows.values():
        subset = Path(row["path"]).parent.name
        c = per[subset]
        c["schemas"] += 1
        if row["reason"] is not None:
            reasons[row["reason"]] += 1
            examples.setdefault(row["reason"], f"{subset}/{Path(row['path']).name}")
            continue
        c["compiled"] += 1
        for key in ("valid", "valid_ok", "invalid"):
            c[key] += row.get(key, 0)
        c["invalid_accepted"] += len(row.get("invalid_accepted", []))
        bad += [(f"{subset}/{Path(row['path']).name}", k) for k in row.get("invalid_accepted", [])]
    total = Counter()
    print(f"{'subset':24s} {'compiled':>14s} {'valid accepted':>16s} {'invalid accepted':>17s}")
    for subset, c in sorted(per.items()):
        total.update(c)
        print(f"{subset:24s} {c['compiled']:5d}/{c['schemas']:<5d}{c['compiled'] / c['schemas']:5.1%}"
              f" {c['valid_ok']:7d}/{c['valid']:<7d} {c['invalid_accepted']:7d}/{c['invalid']:<7d}")
    print(f"overall: compiled {total['compiled']}/{total['schemas']} "
          f"({total['compiled'] / total['schemas']:.2%}); valid accepted {total['valid_ok']}/"
          f"{total['valid']} ({total['valid_ok'] / max(total['valid'], 1):.2%}); invalid accepted "
          f"{total['invalid_accepted']}/{total['invalid']}")
    print("accepted-invalid instances:", bad)
    print("refusals by reason:")
    for reason, n in reasons.most_common():
        print(f"  {n:5d}  {reason}   (e.g. {examples[reason]})")


def refused(out_files: list[str]) -> None:
    """Prints the path of every refused schema in ``out_files`` (input for ``--only``)."""
    for name in out_files:
        for line in Path(name).read_text().splitlines():
            row = json.loads(line)
            if "path" in row and row["reason"] is not None:
                print(row["path"])


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5] == "1")
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default=None,
                        help="maskbench-dev folder, one subfolder per subset (default: the sample "
                             "in tests/data/conformance)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", default="/tmp/maskbench_coverage")
    parser.add_argument("--limit", type=int, default=None, help="first N schemas only (smoke run)")
    parser.add_argument("--every", type=int, default=1,
                        help="every K-th schema of the sorted list: a spread sample of all subsets")
    parser.add_argument("--only", default=None,
                        help="file listing the schema paths to measure, one a line")
    parser.add_argument("--compile-only", action="store_true", help="no instance walks")
    parser.add_argument("--report-only", action="store_true", help="re-print from --out files")
    parser.add_argument("--refused", action="store_true",
                        help="print the refused schema paths of --out files")
    args = parser.parse_args()
    if args.data:   # read by tests/constrain/conformance.py here and in the worker processes
        os.environ["TAMIS_MASKBENCH_DIR"] = str(Path(args.data).resolve())
    outs = [f"{args.out}.{k}.jsonl" for k in range(args.jobs)]
    if args.report_only or args.refused:
        (refused if args.refused else report)(outs)
        return
    for name in outs:
        if os.path.exists(name):
            os.remove(name)
    only = str(Path(args.only).resolve()) if args.only else ""
    procs = [subprocess.Popen([sys.executable, __file__, "--supervise", outs[k], str(k), str(args.jobs),
                               str(args.every), str(args.limit or 0), only,
                               str(int(not args.compile_only))]) for k in range(args.jobs)]
    for proc in procs:
        proc.wait()
    report(outs)


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "--supervise":
    out, part, parts, every = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    limit = int(sys.argv[6]) or None
    chosen = Path(sys.argv[7]).read_text().split() if sys.argv[7] else all_schemas()
    supervise(chosen[::every][:limit][part::parts], out, sys.argv[8] == "1")
elif __name__ == "__main__":
    main()
