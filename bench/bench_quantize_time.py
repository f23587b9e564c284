"""Wall time of `tamis quantize --method gptq` against llm-compressor's GPTQModifier, one
after the other on the same CPU, the same checkpoint and the same calibration token ids.

    python bench/bench_quantize_time.py [--num-samples 16] [--seq-len 128] [--threads 1]
        [--repeats 1] [--workdir W] [--ppl-tokens 8192] [--skip-default]

The model is the embedded SmolLM2-135M (float32). Equal settings, both sides:
- 4-bit symmetric integer weights, groups of 128 input columns when every linear's K is a
  multiple of 128, else the largest of 64 / 32 that divides them all (SmolLM2: K = 576, so
  64); every decoder Linear quantized, lm_head kept;
- GPTQ with blocks of 128 columns, damping 0.01 of the mean Hessian diagonal, columns
  visited in act order with groups kept contiguous and their grids fitted on the original
  weights first (llm-compressor's default ``actorder="static"``; tamis ``--static-groups``);
- grids cover each group's min..max (llm-compressor's minmax observer; tamis
  ``--no-clip-search --no-output-clip``), no rotation, no scale refit (``--refine 0
  --no-refit``);
- the same calibration windows: tamis's default calibration text cut by tamis into
  ``--num-samples`` windows of ``--seq-len`` tokens, written to ``calibration_ids.json``
  for llm-compressor and given to `tamis quantize` as the same text (``--calibration-text``,
  which tamis cuts the same way);
- ``--threads`` torch threads (and OMP_NUM_THREADS) in both processes.
Each side is one child process, timed from its start (imports included) to the written
checkpoint; the pair runs ``--repeats`` times, alternating, and the ratio is taken run by
run (on a shared machine the load moves between runs). llm-compressor 0.14 runs in the
cross-check venv of tests/quant/libraries.py
(built from PyPI on first use).

A third row times tamis's defaults (`tamis quantize --method gptq` with no flag but
``--threads``: rotation, output-error clip search, static groups, one refine round, group
128, 16 windows of 512 tokens); it is not an equal-settings comparison.

Perplexity (``--ppl-tokens`` > 0): tamis's model code in float32 on the first tokens of
``pydoc_data.topics``, windows of 512 (bench_quant.py's helper), for each written checkpoint.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

_LLMCOMPRESSOR = r"""
import json, sys, torch
model_dir, ids_file, out, group, damp, threads = sys.argv[1:7]
torch.set_num_threads(int(threads))
from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
from datasets import Dataset
from llmcompressor import oneshot
from llmcompressor.modifiers.gptq import GPTQModifier
from transformers import AutoModelForCausalLM, AutoTokenizer

rows = json.load(open(ids_file))
dataset = Dataset.from_dict({"input_ids": rows, "attention_mask": [[1] * len(r) for r in rows]})
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
weights = QuantizationArgs(num_bits=4, type="int", symmetric=True, strategy="group",
                           group_size=int(group))
recipe = GPTQModifier(config_groups={"group_0": QuantizationScheme(targets=["Linear"],
                                                                   weights=weights)},
                      ignore=["lm_head"], dampening_frac=float(damp), block_size=128,
                      actorder="static")
oneshot(model=model, recipe=recipe, dataset=dataset, max_seq_length=len(rows[0]),
        num_calibration_samples=len(rows))
model.save_pretrained(out, save_compressed=True)
AutoTokenizer.from_pretrained(model_dir).save_pretrained(out)
"""


def shared_group_size(model_dir: Path) -> int:
    """128, else the largest of 64 / 32 dividing hidden_size and intermediate_size (the K
    of every decoder linear)."""
    config = json.loads((model_dir / "config.json").read_text())
    ks = (config["hidden_size"], config["intermediate_size"])
    for group in (128, 64, 32):
        if all(k % group == 0 for k in ks):
            return group
    raise SystemExit(f"no group size of 128 / 64 / 32 divides K = {ks}")


def write_calibration(model_dir: Path, work: Path, num_samples: int, seq_len: int) -> Path:
    """Writes calibration.txt (tamis's default text) and calibration_ids.json (its windows,
    cut as `tamis quantize` cuts them); returns the text's path."""
    from transformers import AutoTokenizer

    from tamis.quant.quantizer import calibration

    text = calibration.default_calibration_text()
    windows = calibration.calibration_samples(AutoTokenizer.from_pretrained(model_dir), text,
                                              num_samples, seq_len)
    if len(windows) < num_samples:
        raise SystemExit(f"the calibration text holds only {len(windows)} windows of {seq_len}")
    (work / "calibration_ids.json").write_text(json.dumps([w.tolist() for w in windows]))
    path = work / "calibration.txt"
    path.write_text(text)
    return path


def timed(cmd: list[str], threads: int) -> float:
    """Seconds ``cmd`` ran; raises SystemExit with its output tail when it fails."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false"}
    shown = [c if len(c) < 200 else "<script>" for c in cmd]  # llm-compressor's -c source
    print("$", " ".join(shown), flush=True)
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
    return seconds


def tamis_command(model_dir: Path, out: Path, flags: list[str], threads: int) -> list[str]:
    return [sys.executable, "-m", "tamis.cli", "quantize", str(model_dir), "--method", "gptq",
            "--output", str(out), "--threads", str(threads), *flags]


def equal_flags(text: Path, args, group: int) -> list[str]:
    return ["--calibration-text", str(text), "--num-samples", str(args.num_samples),
            "--seq-len", str(args.seq_len), "--group-size", str(group), "--bits", "4", "--sym",
            "--no-rotate", "--static-groups", "--no-clip-search", "--no-output-clip",
            "--refine", "0", "--no-refit", "--damp", str(args.damp)]


def run(args) -> list[dict]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "quant"))
    from libraries import library_python

    from tamis.engine.embedded import default_model_path

    model_dir = default_model_path()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="tamis-bench-qtime-"))
    work.mkdir(parents=True, exist_ok=True)
    group = shared_group_size(model_dir)
    text = write_calibration(model_dir, work, args.num_samples, args.seq_len)
    settings = f"g{group}, {args.num_samples} x {args.seq_len}"
    rows = [
        {"row": f"llm-compressor GPTQ ({settings})", "out": work / "llmcompressor", "pair": True,
         "cmd": [str(library_python()), "-c", _LLMCOMPRESSOR, str(model_dir),
                 str(work / "calibration_ids.json"), str(work / "llmcompressor"), str(group),
                 str(args.damp), str(args.threads)]},
        {"row": f"tamis GPTQ, equal settings ({settings})", "out": work / "tamis-equal",
         "pair": True, "cmd": tamis_command(model_dir, work / "tamis-equal",
                                            equal_flags(text, args, group), args.threads)},
    ]
    if not args.skip_default:
        rows.append({"row": "tamis GPTQ, its defaults (g128, 16 x 512, rotated)",
                     "out": work / "tamis-default",
                     "cmd": tamis_command(model_dir, work / "tamis-default", [], args.threads)})
    # The equal-settings pair alternates ``--repeats`` times, so a change in the machine's
    # load hits both sides; each row keeps every time, and the default row runs once.
    for _ in range(args.repeats):
        for row in rows[:2]:
            row.setdefault("times", []).append(timed(row["cmd"], args.threads))
            print(f"{row['row']}: {row['times'][-1]:.1f} s", flush=True)
    for row in rows[2:]:
        row["times"] = [timed(row["cmd"], args.threads)]
        print(f"{row['row']}: {row['times'][0]:.1f} s", flush=True)
    if args.ppl_tokens:
        add_perplexities(rows, model_dir, args.ppl_tokens)
    return rows


def add_perplexities(rows: list[dict], model_dir: Path, tokens: int) -> None:
    from transformers import AutoTokenizer

    from bench_quant import evaluation_ids, perplexity

    ids = evaluation_ids(AutoTokenizer.from_pretrained(model_dir), tokens)
    rows.insert(0, {"row": "unquantized", "out": model_dir})
    for row in rows:
        row["ppl"] = perplexity(row["out"], ids, 512)


def print_table(rows: list[dict], args) -> None:
    print(f"\nGPTQ 4-bit on SmolLM2-135M, CPU, {args.threads} thread(s), "
          f"load {os.getloadavg()[0]:.2f} at the end")
    print(f"{'row':52s} {'median s':>9s} {'every run, s':>24s} {'ppl':>9s}")
    for row in rows:
        times = row.get("times", [])
        median = f"{statistics.median(times):9.1f}" if times else f"{'':9s}"
        every = " ".join(f"{t:.1f}" for t in times)
        ppl = f"{row['ppl']:9.4f}" if "ppl" in row else ""
        print(f"{row['row']:52s} {median} {every:>24s} {ppl}")
    library, ours = (r["times"] for r in rows if r.get("pair"))
    ratios = [t / lib for t, lib in zip(ours, library)]
    print(f"\ntamis / llm-compressor wall time at equal settings, run by run: "
          f"{' '.join(f'{r:.2f}x' for r in ratios)}; median {statistics.median(ratios):.2f}x "
          f"(target <= 1.5x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-samples", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--damp", type=float, default=0.01)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=1,
                        help="runs of the equal-settings pair, alternating")
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--ppl-tokens", type=int, default=8192,
                        help="evaluation tokens of pydoc_data.topics; 0: no perplexity")
    parser.add_argument("--skip-default", action="store_true",
                        help="leave out the row of tamis's default settings")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print_table(run(args), args)


if __name__ == "__main__":
    main()
