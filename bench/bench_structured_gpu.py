"""Structured generation on the GPU (W4): tamis against vLLM on the same requests.

Workload: 256 requests, prompts of 128-512 random token ids (fresh each timed pass, the
same for every engine), 256 output tokens, temperature 1.0, Llama-3.1-8B shape with
dummy bf16 weights and SmolLM2's tokenizer (vocabulary 49,152). Variants:

    unconstrained  EOS ignored
    json           an object holding an array of at least 40 {name, qty, ok} items
    regex          ``(([a-z]{2,10}) ){200}`` (a counted repetition)
    gbnf / lark    the JSON variant's language as a GBNF / a Lark grammar

None of the constrained outputs can complete inside 256 tokens, so every request of every
variant generates 256 tokens and the figures compare equal work. Each finished output is
checked (``jsonschema`` for JSON, ``re.fullmatch`` for the regex, tamis's matcher for the
grammars); each unfinished one must be a valid prefix (tamis's matcher, byte by byte).

    python bench/bench_structured_gpu.py --tokenizer DIR [--engines tamis,vllm]
        [--variants unconstrained,json,regex,gbnf,lark] [--repeats 2] [--profile]

Each engine runs in its own subprocess (``subprocess_runs.run_each``); vLLM, installed on
the GPU machine from the wheels bench/device/make_bundle.py collects, is not a dependency of
tamis. A warm-up pass of 8 short requests per variant compiles the constraint first (both
engines cache compiled constraints, as a server does); mask rows of the states the timed
pass reaches first are computed during the timed pass. ``--profile`` adds tamis's host time
per step phase (tamis only). ``--tokenizer`` defaults to the embedded SmolLM2's folder.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from llama8b import make_prompts, write_llama8b_config  # noqa: E402
from subprocess_runs import run_each  # noqa: E402
from bench_structured import THROUGHPUT_SCHEMA  # noqa: E402
from call_timing import time_calls  # noqa: E402

VOCAB = 49152

ITEMS_SCHEMA = THROUGHPUT_SCHEMA   # an object holding an array of 40+ {name, qty, ok} items

WORDS_REGEX = r"(([a-z]{2,10}) ){200}"

ITEMS_GBNF = r'''
root ::= "{\"items\":[" item ("," item){39,} "]}"
item ::= "{\"name\":\"" char{0,24} "\",\"qty\":" qty ",\"ok\":" ("true" | "false") "}"
char ::= [^"\\\x00-\x1f] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4})
qty ::= "0" | [1-9] [0-9]{0,2}
'''

ITEMS_LARK = r'''
start: "{\"items\":[" item ("," item)~39 ("," item)* "]}"
item: "{\"name\":" NAME ",\"qty\":" QTY ",\"ok\":" BOOL "}"
NAME: /"([^"\\\x00-\x1f]|\\(["\\\/bfnrt]|u[0-9a-fA-F]{4})){0,24}"/
QTY: /0|[1-9][0-9]{0,2}/
BOOL: "true" | "false"
'''

VARIANTS = {"unconstrained": None, "json": {"json": ITEMS_SCHEMA},
            "regex": {"regex": WORDS_REGEX}, "gbnf": {"grammar": ITEMS_GBNF},
            "lark": {"grammar": ITEMS_LARK}}


# ---- the engines --------------------------------------------------------------------------

def model_folder(tokenizer_dir: str, tiny: bool) -> Path:
    """The 8B shape (``tiny``: 2 layers of width 256, a CPU smoke test) with SmolLM2's
    tokenizer files beside its config."""
    shrink = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                  torch_dtype="float32") if tiny else {}
    folder = write_llama8b_config(tempfile.mkdtemp(), vocab_size=VOCAB, eos_token_id=2,
                                  bos_token_id=1, **shrink)
    for path in Path(tokenizer_dir).iterdir():
        if path.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            shutil.copy(path, folder / path.name)
    return folder


class Runner:
    """One engine (``llm``: its ``LLM``) and its ``SamplingParams`` / ``StructuredOutputsParams``
    classes: both engines take vLLM's names."""
    name = "?"

    def generate(self, prompts, constraint, max_tokens):
        params = self.sampling_params(
            max_tokens=max_tokens, temperature=1.0, ignore_eos=constraint is None,
            structured_outputs=self.structured_params(**constraint) if constraint else None)
        outs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], params,
                                 use_tqdm=False)
        return [(o.outputs[0].text, len(o.outputs[0].token_ids), o.outputs[0].finish_reason)
                for o in outs]


class TamisRunner(Runner):
    name = "tamis"

    def __init__(self, folder: Path, args):
        from tamis.constrain import StructuredOutputsParams
        from tamis.engine.llm import LLM
        from tamis.engine.sampling_params import SamplingParams
        self.sampling_params, self.structured_params = SamplingParams, StructuredOutputsParams
        self.llm = LLM(model=str(folder), load_format="dummy",
                       dtype="float32" if args.tiny else "bfloat16",
                       max_model_len=2048, max_num_seqs=256, gpu_memory_utilization=0.9,
                       structured_outputs_jump_forward=args.jump_forward,
                       structured_outputs_workers=args.workers)


class VllmRunner(Runner):
    def __init__(self, folder: Path, args):
        os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")   # flashinfer is not in the bundle
        import vllm
        from vllm.sampling_params import StructuredOutputsParams
        self.name = f"vllm {vllm.__version__}"
        self.sampling_params, self.structured_params = vllm.SamplingParams, StructuredOutputsParams
        self.llm = vllm.LLM(model=str(folder), load_format="dummy", dtype="bfloat16",
                            max_model_len=2048, max_num_seqs=256, gpu_memory_utilization=0.9)


# ---- tamis's step profile -----------------------------------------------------------------

class HostProfile:
    """Host wall time per engine step phase (tamis): forward queued, previous step read
    (its wait for the ids included), masks filled, sampling queued; with the manager's
    mask time and the number of mask rows built (first visits of automaton states)."""

    def __init__(self, engine):
        self.engine, self.totals, self.steps = engine, {}, 0
        self._wrap(engine.runner, "execute_model", "forward_queued")
        self._wrap(engine, "_finish_step", "read_and_append")
        self._wrap(engine, "_fill_bitmask", "fill_bitmask")
        self._wrap(engine.runner, "sample", "sample_queued")
        self._wrap(engine.scheduler, "schedule", "schedule")
        self._wrap(engine, "step", "step")

    def _wrap(self, obj, method, label):
        def add(seconds: float) -> None:
            self.totals[label] = self.totals.get(label, 0.0) + seconds
            self.steps += label == "step"
        time_calls(obj, method, add)

    def summary(self, seconds: float) -> dict:
        steps = max(self.steps, 1)
        out = {f"{k}_ms_per_step": round(1e3 * v / steps, 3) for k, v in self.totals.items()}
        manager = self.engine._structured
        if manager is not None:
            out["mask_rows_built"] = sum(len(getattr(c, "_rows", ())) for c in _compiled(manager))
            workers = manager.row_workers
            out["rows_built_by_workers"] = workers.rows_built if workers is not None else 0
            out["rows_built_ahead"] = workers.rows_ahead if workers is not None else 0
        out.update(steps=self.steps, seconds=round(seconds, 3))
        return out


def _compiled(manager) -> list:
    cache = getattr(manager.compiler, "_cache", {})
    found = []
    for value in cache.values():
        result = value.result() if hasattr(value, "result") else value
        found.append(result)
    return found


# ---- one engine, every variant ---------------------------------------------------------------

def run_engine(args) -> dict:
    folder = model_folder(args.tokenizer, args.tiny)
    t0 = time.perf_counter()
    runner = (TamisRunner if args.engine == "tamis" else VllmRunner)(folder, args)
    result = {"engine": runner.name, "startup_s": round(time.perf_counter() - t0, 1), "variants": {}}
    for variant in args.variants.split(","):
        if f"{args.engine}:{variant}" in args.skip.split(","):
            continue
        try:
            result["variants"][variant] = run_variant(runner, variant, args)
        except Exception as exc:   # a failed variant is a row that says why
            import traceback
            traceback.print_exc()
            result["variants"][variant] = {"error": f"{type(exc).__name__}: {exc}"}
    return result


def run_variant(runner, variant: str, args) -> dict:
    """Warm-up (8 short requests, the constraint compiled), then the timed passes."""
    constraint = VARIANTS[variant]
    runner.generate(make_prompts(8, 16, 64, args.seed - 1, vocab=VOCAB), constraint, 16)
    passes = []
    repeats = args.repeats if runner.name == "tamis" else (args.peer_repeats or args.repeats)
    for rep in range(repeats):
        if passes and passes[-1]["seconds"] > args.max_pass_seconds:
            break   # one slow pass is figure enough (vLLM on the counted regex)
        prompts = make_prompts(args.num_prompts, args.min_prompt, args.max_prompt,
                               args.seed + 1000 * rep + list(VARIANTS).index(variant), vocab=VOCAB)
        profile = (HostProfile(runner.llm.llm_engine)
                   if args.profile and args.engine == "tamis" else None)
        t0 = time.perf_counter()
        outs = runner.generate(prompts, constraint, args.output_len)
        seconds = time.perf_counter() - t0
        tokens = sum(n for _, n, _ in outs)
        entry = {"seconds": round(seconds, 3), "output_tokens": tokens,
                 "output_tok_s": round(tokens / seconds, 1)}
        if profile is not None:
            entry["profile"] = profile.summary(seconds)
            _unwrap(runner.llm.llm_engine)
        passes.append(entry)
        print(runner.name, variant, entry, flush=True)
    return {"passes": passes, "outputs": [(t, r) for t, _, r in outs]}


def _unwrap(engine) -> None:
    for obj in (engine, engine.runner, engine.scheduler):
        for name in list(vars(obj)):
            if name in ("execute_model", "_finish_step", "_fill_bitmask", "sample", "schedule", "step"):
                delattr(obj, name)


# ---- validity -------------------------------------------------------------------------------

def check_outputs(variant: str, outputs: list, info) -> dict:
    """Finished outputs must match; unfinished ones must be valid prefixes."""
    from tamis.constrain import StructuredOutputsParams, compile_constraint
    constraint = VARIANTS[variant]
    if constraint is None:
        return {}
    # JSON allows any whitespace between tokens; tamis's own default bounds it, so the
    # check takes JSON's rule.
    extra = {"whitespace_pattern": r"[ \t\n\r]*"} if variant == "json" else {}
    compiled = compile_constraint(StructuredOutputsParams(**constraint, **extra), info)
    finished = invalid = bad_prefix = 0
    for text, reason in outputs:
        matcher = compiled.matcher()
        prefix_ok = matcher.accept_bytes(text.encode())
        if reason == "stop":
            finished += 1
            invalid += not (prefix_ok and matcher.is_complete() and _independent_check(variant, text))
        else:
            bad_prefix += not prefix_ok
    return {"finished": finished, "invalid_finished": invalid, "invalid_prefix": bad_prefix}


def _independent_check(variant: str, text: str) -> bool:
    if variant == "json":
        import jsonschema
        try:
            jsonschema.validate(json.loads(text), ITEMS_SCHEMA)
        except (ValueError, jsonschema.ValidationError):
            return False
        return True
    if variant == "regex":
        return re.fullmatch(WORDS_REGEX, text) is not None
    return True


# ---- parent: the table ------------------------------------------------------------------------

def parent(args) -> None:
    if args.report:   # the table of an earlier run, from the files its engines wrote
        rows = [json.loads(path.read_text())
                for path in sorted(Path(args.report).glob("structured_gpu_*.json"))]
    else:
        rows = run_each(__file__, "--engine", args.engines.split(","), args.out,
                        "structured_gpu", "engine")
    from transformers import AutoTokenizer

    from tamis.constrain import TokenizerInfo
    info = TokenizerInfo.from_hf(AutoTokenizer.from_pretrained(args.tokenizer), vocab_size=VOCAB)
    by_engine = {r["engine"]: r for r in rows if "error" not in r}
    print(f"\nW4 structured, {args.num_prompts} requests, prompts {args.min_prompt}-"
          f"{args.max_prompt} random ids, {args.output_len} tokens out, temperature 1.0, "
          f"Llama-3.1-8B shape (dummy bf16), SmolLM2 tokenizer")
    names = list(by_engine)
    print("Passes in order: the first reaches most automaton states for the first time; "
          "ratios are per pass.")
    print("| variant | " + " | ".join(f"{n} out tok/s" for n in names)
          + " | tamis / own unconstrained | tamis / vLLM | finished / invalid / bad prefixes |")
    print("|---" * (len(names) + 4) + "|")
    for variant in args.variants.split(","):
        print(_table_row(variant, names, by_engine, info))
    for row in rows:
        if "error" in row:
            print(f"{row['engine']}: failed ({row['error']})")
    for name, row in by_engine.items():
        for variant, data in row["variants"].items():
            for p in data["passes"]:
                if "profile" in p:
                    print(f"profile {name} {variant}: {json.dumps(p['profile'])}")


def _figures(row: dict | None, variant: str) -> list[float]:
    data = (row or {}).get("variants", {}).get(variant, {})
    return [p["output_tok_s"] for p in data.get("passes", [])]


def _ratios(ours: list[float], theirs: list[float]) -> str:
    """Pass i over pass i (over the one pass when the other side ran one)."""
    if not ours or not theirs:
        return ""
    return " / ".join(f"{f / theirs[min(i, len(theirs) - 1)]:.2f}" for i, f in enumerate(ours))


def _table_row(variant: str, names: list[str], by_engine: dict, info) -> str:
    cells, checks = [], []
    for name in names:
        data = by_engine[name]["variants"].get(variant)
        if data is None:
            cells.append("not run")
            continue
        cells.append(f"failed: {data['error'][:80]}" if "error" in data
                     else " / ".join(f"{f:,.0f}" for f in _figures(by_engine[name], variant)))
        c = check_outputs(variant, data.get("outputs", []), info)
        if c:
            checks.append(f"{name}: {c['finished']} / {c['invalid_finished']} / "
                          f"{c['invalid_prefix']}")
    tamis = by_engine.get("tamis")
    peer = next((by_engine[n] for n in names if n.startswith("vllm")), None)
    ours = _figures(tamis, variant)
    return (f"| {variant} | " + " | ".join(cells)
            + f" | {_ratios(ours, _figures(tamis, 'unconstrained'))}"
            + f" | {_ratios(ours, _figures(peer, variant))} | " + "; ".join(checks) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--engines", default="tamis,vllm")
    parser.add_argument("--engine", help=argparse.SUPPRESS)
    parser.add_argument("--json", help=argparse.SUPPRESS)
    parser.add_argument("--variants", default="unconstrained,json,regex,gbnf,lark")
    parser.add_argument("--tokenizer", default=None,
                        help="folder with SmolLM2's tokenizer (default: the embedded model's)")
    parser.add_argument("--num-prompts", type=int, default=256)
    parser.add_argument("--min-prompt", type=int, default=128)
    parser.add_argument("--max-prompt", type=int, default=512)
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--peer-repeats", type=int, default=0,
                        help="timed passes of vLLM (default: --repeats)")
    parser.add_argument("--skip", default="",
                        help="ENGINE:VARIANT pairs not to run, e.g. vllm:regex")
    parser.add_argument("--max-pass-seconds", type=float, default=60.0,
                        help="no further pass of a variant after one this slow")
    parser.add_argument("--jump-forward", action="store_true",
                        help="tamis appends forced tokens without sampling them")
    parser.add_argument("--workers", type=int, default=None,
                        help="tamis's mask row worker processes (default: the engine's)")
    parser.add_argument("--profile", action="store_true", help="tamis's host time per phase")
    parser.add_argument("--tiny", action="store_true",
                        help="a 2-layer model of width 256 (a smoke test of the script on CPU)")
    parser.add_argument("--report", default=None, metavar="DIR",
                        help="print the table of the run whose files are in DIR; run nothing")
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--out", default=os.environ.get("OUT", "bench_out"))
    args = parser.parse_args()
    if args.tokenizer is None:
        from tamis.engine.embedded import default_model_path
        args.tokenizer = str(default_model_path())
        sys.argv += ["--tokenizer", args.tokenizer]
    if args.engine:
        try:
            result = run_engine(args)
        except Exception as exc:   # a failed engine is a row that says why
            import traceback
            traceback.print_exc()
            result = {"engine": args.engine, "error": f"{type(exc).__name__}: {exc}"}
        Path(args.json).write_text(json.dumps(result))
        return
    if "--seed" not in sys.argv:   # every child gets the same fresh prompts
        sys.argv += ["--seed", str(args.seed)]
    parent(args)


if __name__ == "__main__":
    main()
