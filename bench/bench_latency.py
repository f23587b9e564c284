"""W2 decode latency at batch 1 on the GPU (tamis against transformers, one process),
and greedy equality of the two on the same weights.

Workload (W2 of bench/RESULTS.md): one request, a 128-token random prompt, 256 output tokens,
EOS ignored, greedy; random bf16 weights at the ``--shape`` (bench/shapes.py; default
Llama-3.1-8B). Figure: output tokens / end-to-end seconds (prefill included), median of
``--repeats``.

    python bench/bench_latency.py [--check-greedy 8]
    python bench/bench_latency.py --shape mixtral-8x7b --quantization fp8 --skip-transformers \
        --vllm-json OUT/w1_vllm.json

One set of weights serves both engines: transformers builds the model with random
weights on the GPU, and tamis (``load_format="dummy"``) then loads that state dict
through ``model.load_weights``. ``--check-greedy N``: N random prompts, the first 32
greedy tokens of each engine compared (target: identical on >= 7 of 8). With
``--hf-uncached`` transformers also runs without a cache (how far it agrees with itself),
and each engine's argmax is taken on transformers' own 32 generated tokens, teacher-forced
(a near-tie then costs one position, not the rest of the sequence).
``--model DIR``: a real checkpoint instead of dummy weights (both engines load it), with
English prompts for the greedy check: random weights give near-tied logits, where bf16
rounding order decides the argmax. ``--vllm-json FILE``: vLLM's W2 measured in the same
call by bench_vllm.py / bench_offline.py at the same ``--shape`` and ``--quantization``
(another shape's file is refused); without it, vLLM's row is the recorded figure, shown
for the default shape only.

``--skip-transformers``: tamis alone on its own dummy weights, for the mixture-of-experts
shapes whose weights do not fit twice on one GPU (no greedy check then); tamis then takes
0.9 of the GPU instead of 0.6. ``--quantization`` (e.g. ``fp8``, online FP8) needs it:
transformers' bf16 weights cannot be loaded into tamis's quantized layers.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from shapes import DEFAULT_SHAPE, add_shape_args, describe, write_shape_config  # noqa: E402

RECORDED_PEERS = {"transformers": 11.5, "vllm": 196.0}   # measured once on an H200


def random_prompt(rng: random.Random, length: int, vocab: int) -> list[int]:
    return [rng.randrange(vocab) for _ in range(length)]


DEVICE = "cuda" if torch.cuda.is_available() else "cpu"   # CPU: a dry run of the script


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


TEXT_PROMPTS = [
    "The capital of France is", "Write a haiku about the sea.",
    "def fibonacci(n):", "Explain photosynthesis to a child in three sentences.",
    "List five prime numbers:", "Once upon a time, in a small village,",
    "Translate to French: I would like a cup of coffee.", "The three laws of motion are",
    # 24 more, so that --check-greedy 32 compares distinct prompts (the first 8 are the
    # recorded set; the index wraps past the end)
    "The largest planet in the solar system is", "Write a short poem about autumn leaves.",
    "import numpy as np\n\ndef mean(values):", "What is the boiling point of water?",
    "Give three tips for staying healthy.", "The history of the Roman Empire began",
    "Summarize the plot of Romeo and Juliet.", "A recipe for pancakes needs",
    "The difference between a virus and a bacterium is", "SELECT name FROM users WHERE",
    "Describe the color blue to someone who cannot see.", "The first person to walk on the moon",
    "Count from one to ten in Spanish:", "Why is the sky blue?",
    "My favourite book is", "Write a limerick about a cat.",
    "The steps to solve a quadratic equation are", "In 1492, Columbus",
    "Explain what a neural network is.", "The best way to learn a language is",
    "for (int i = 0; i < n; i++) {", "Dear hiring manager,",
    "The main ingredients of bread are", "List the days of the week:",
]


def build_transformers(model_dir: Path, dtype: str, pretrained: bool = False):
    from transformers import AutoConfig, AutoModelForCausalLM
    if pretrained:
        return AutoModelForCausalLM.from_pretrained(model_dir, dtype=DTYPES[dtype],
                                                    attn_implementation="sdpa").to(DEVICE).eval()
    config = AutoConfig.from_pretrained(model_dir)
    with torch.device(DEVICE):
        model = AutoModelForCausalLM.from_config(config, dtype=DTYPES[dtype],
                                                 attn_implementation="sdpa")
    return model.eval()


@torch.inference_mode()
def hf_margin(model, prefix: list[int], hf_token: int, other_token: int) -> float:
    """transformers' logit gap between its own choice and tamis's at one position,
    in units of the logits' standard deviation (a near-tie is a small number)."""
    logits = model(torch.tensor([prefix], device=DEVICE)).logits[0, -1].float()
    return float((logits[hf_token] - logits[other_token]) / logits.std())


@torch.inference_mode()
def hf_generate(model, prompt: list[int], new_tokens: int) -> list[int]:
    ids = torch.tensor([prompt], device=DEVICE)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                         min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    return out[0, len(prompt):].tolist()


@torch.inference_mode()
def hf_uncached(model, prompt: list[int], new_tokens: int) -> list[int]:
    """transformers' greedy tokens with no KV cache: one full forward over the whole
    sequence per token. The same weights and math as ``generate`` with other kernel
    shapes (a prefill GEMM instead of a GEMV, no cache): how far transformers agrees
    with itself sets the bar for any other engine at bf16 near-ties."""
    banned = banned_ids(model)
    ids = list(prompt)
    for _ in range(new_tokens):
        logits = model(torch.tensor([ids], device=DEVICE), use_cache=False).logits[0, -1]
        logits[banned] = float("-inf")     # as min_new_tokens in hf_generate
        ids.append(int(logits.argmax()))
    return ids[len(prompt):]


@torch.inference_mode()
def hf_teacher_forced(model, prompt: list[int], continuation: list[int]) -> list[int]:
    """transformers' argmax at each position of ``continuation`` given the tokens before
    it (one full forward, no cache; EOS banned as in ``hf_uncached``)."""
    seq = torch.tensor([prompt + continuation[:-1]], device=DEVICE)
    logits = model(seq, use_cache=False).logits[0, len(prompt) - 1:].float()
    logits[:, banned_ids(model)] = float("-inf")
    return logits.argmax(dim=-1).tolist()


def tamis_teacher_forced(llm, prompt: list[int], continuation: list[int],
                         banned: list[int]) -> list[int]:
    """tamis's argmax at each position of ``continuation`` given the tokens before it,
    from one prefill of prompt + continuation (``prompt_logprobs``: its model code,
    attention and logits on the same prefix transformers sees; the prefix cache is
    skipped for such requests)."""
    from tamis.engine.sampling_params import SamplingParams
    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=len(banned) + 1,
                            detokenize=False)
    out = llm.generate([{"prompt_token_ids": prompt + continuation}], params, use_tqdm=False)
    entries = out[0].prompt_logprobs[len(prompt):]
    return [min((lp.rank, token) for token, lp in entry.items()
                if lp.rank is not None and token not in banned)[1] for entry in entries]


def banned_ids(model) -> list[int]:
    eos = model.generation_config.eos_token_id
    return [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def text_prompt(model_dir: Path, index: int) -> list[int]:
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return tokenizer(TEXT_PROMPTS[index % len(TEXT_PROMPTS)]).input_ids


def time_it(fn, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return times


def build_tamis(model_dir: Path, hf_model, args):
    """tamis on the checkpoint (``--model``), else on dummy weights overwritten by
    ``hf_model``'s when there is one (the greedy check needs the same weights)."""
    from tamis.engine.llm import LLM
    real = args.model is not None
    llm = LLM(model=str(model_dir), load_format="auto" if real else "dummy", dtype=args.dtype,
              quantization=args.quantization, skip_tokenizer_init=not real,
              max_model_len=args.max_model_len, max_num_seqs=256,
              gpu_memory_utilization=gpu_memory_utilization(args),
              enforce_eager=args.enforce_eager, attention_backend=args.attention_backend)
    if real or hf_model is None:
        return llm
    runner_model = llm.llm_engine.runner.model
    runner_model.load_weights((name, tensor) for name, tensor in hf_model.state_dict().items())
    llm.reset_prefix_cache() if hasattr(llm, "reset_prefix_cache") else None
    return llm


def gpu_memory_utilization(args) -> float:
    """The flag, else 0.6 beside transformers' copy of the weights and 0.9 alone."""
    if args.gpu_memory_utilization is not None:
        return args.gpu_memory_utilization
    return 0.9 if args.skip_transformers else 0.6


def tamis_generate(llm, prompt: list[int], new_tokens: int) -> list[int]:
    from tamis.engine.sampling_params import SamplingParams
    # min_tokens bans EOS until new_tokens are out, as transformers' min_new_tokens does.
    # Not ignore_eos: that takes EOS out of the stop ids min_tokens masks (vLLM's semantics),
    # so on a real checkpoint an EOS argmax would be kept where transformers bans it.
    params = SamplingParams(max_tokens=new_tokens, min_tokens=new_tokens, temperature=0.0,
                            detokenize=False)
    out = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
    return list(out[0].outputs[0].token_ids)


def check_greedy(llm, hf, model_dir: Path, rng: random.Random, args) -> list[dict]:
    """One row per prompt: tamis's and transformers' first 32 greedy tokens compared."""
    vocab = prompt_vocab_of(model_dir)
    greedy = []
    for i in range(args.check_greedy):
        p = text_prompt(model_dir, i) if args.model else \
            random_prompt(rng, rng.randint(16, 256), vocab)
        a, b = tamis_generate(llm, p, 32), hf_generate(hf, p, 32)
        first_diff = first_difference(a, b)
        margin = None if first_diff is None else round(
            hf_margin(hf, p + b[:first_diff], b[first_diff], a[first_diff]), 4)
        row = dict(prompt_len=len(p), identical=a == b, first_diff=first_diff,
                   hf_margin_in_std=margin)
        if args.hf_uncached:
            c = hf_uncached(hf, p, 32)
            forced = hf_teacher_forced(hf, p, b)
            tamis_forced = tamis_teacher_forced(llm, p, b, banned_ids(hf))
            row.update(tamis_vs_uncached=first_difference(a, c),
                       generate_vs_uncached=first_difference(b, c),
                       forced_positions=len(b),
                       forced_tamis_vs_full=sum(x == y for x, y in zip(tamis_forced, forced)),
                       forced_generate_vs_full=sum(x == y for x, y in zip(b, forced)))
        greedy.append(row)
    return greedy


def prompt_vocab_of(model_dir: Path) -> int:
    return min(128000, json.loads((model_dir / "config.json").read_text())["vocab_size"])


def print_greedy(greedy: list[dict], args) -> None:
    same = sum(g["identical"] for g in greedy)
    weights = f"the checkpoint {args.model}" if args.model else "the same random weights"
    print(f"\ngreedy ({args.dtype}), first 32 tokens, tamis vs transformers on {weights}: "
          f"{same}/{len(greedy)} identical; first differing index per prompt: "
          f"{[g['first_diff'] for g in greedy]}; transformers' logit margin there, in "
          f"logit std: {[g['hf_margin_in_std'] for g in greedy]}")
    if not args.hf_uncached:
        return
    for key, what in (("tamis_vs_uncached", "tamis vs transformers without cache"),
                      ("generate_vs_uncached", "transformers generate vs without cache")):
        firsts = [g[key] for g in greedy]
        print(f"greedy ({args.dtype}), {what}: "
              f"{sum(f is None for f in firsts)}/{len(greedy)} identical; first differing "
              f"index per prompt: {firsts}")
    positions = sum(g["forced_positions"] for g in greedy)
    print(f"teacher-forced on transformers' generated tokens ({positions} positions, "
          f"argmax of each engine's logits given the same prefix): tamis = transformers "
          f"full forward at {sum(g['forced_tamis_vs_full'] for g in greedy)}; "
          f"transformers generate = its own full forward at "
          f"{sum(g['forced_generate_vs_full'] for g in greedy)}")


def measured_vllm(args) -> dict | None:
    """bench_vllm.py's result from ``--vllm-json``, refused when it timed another shape."""
    if not (args.vllm_json and Path(args.vllm_json).exists()):
        return None
    measured = json.loads(Path(args.vllm_json).read_text())
    # Files written before --shape existed timed the default shape in bf16.
    timed = (measured.get("shape", DEFAULT_SHAPE), measured.get("quantization"))
    if timed != (args.shape, args.quantization):
        sys.exit(f"{args.vllm_json} holds vLLM's W2 for --shape {timed[0]} --quantization "
                 f"{timed[1]}, not for --shape {args.shape} --quantization {args.quantization}: "
                 f"rerun bench_offline.py --engines tamis,vllm with this run's flags")
    return measured if "w2" in measured else None


def print_w2_table(result: dict, vllm: dict | None, args) -> None:
    tamis_rate = result["tamis_tok_s"]
    print(f"\nW2 latency: batch 1, prompt {args.prompt_len}, {args.output_len} output tokens, "
          f"{describe(args.shape, args.quantization)} (median of {args.repeats})")
    print("| engine | output tok/s | ms / token | tamis / this |\n|---|---|---|---|")
    print(f"| tamis (measured) | {tamis_rate:.1f} | {1000 / tamis_rate:.2f} | 1.00 |")
    if not args.skip_transformers:
        print(f"| transformers generate (measured) | {result['hf_tok_s']:.1f} | "
              f"{1000 / result['hf_tok_s']:.2f} | {tamis_rate / result['hf_tok_s']:.2f} |")
    peers = dict(RECORDED_PEERS) if (args.shape, args.quantization) == (DEFAULT_SHAPE, None) \
        else {}
    if vllm is not None:
        rate = vllm["w2"]["output_tok_s"]
        print(f"| {vllm['engine']} (measured, same call) | {rate:.1f} | "
              f"{1000 / rate:.2f} | {tamis_rate / rate:.2f} |")
        peers.pop("vllm", None)
    if args.skip_transformers:
        peers.pop("transformers", None)
    for name, figure in peers.items():
        print(f"| {name} (RECORDED on an H200, not measured here) | {figure} | "
              f"{1000 / figure:.2f} | {tamis_rate / figure:.2f} |")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--hf-repeats", type=int, default=1)
    parser.add_argument("--check-greedy", type=int, default=8, help="prompts compared (0: skip)")
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--gpu-memory-utilization", type=float, default=None,
                        help="tamis's share of the GPU (default 0.6 beside transformers, "
                             "0.9 with --skip-transformers)")
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument("--attention-backend", default="auto", choices=("auto", "torch", "triton"))
    parser.add_argument("--hf-uncached", action="store_true",
                        help="greedy check: also transformers without KV cache, compared to both")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16",
                        help="both engines' weights and compute (W2 is defined in bfloat16)")
    add_shape_args(parser)
    parser.add_argument("--skip-transformers", action="store_true",
                        help="tamis alone on its own dummy weights: no transformers row and no "
                             "greedy check (for shapes whose weights do not fit twice)")
    parser.add_argument("--model", help="a real checkpoint folder instead of dummy weights")
    parser.add_argument("--vllm-json", help="bench_vllm.py's result file (vLLM's measured W2)")
    parser.add_argument("--skip-timing", action="store_true", help="greedy check only")
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--out", default=os.environ.get("OUT", "bench_out"))
    args = parser.parse_args()
    if args.quantization and not (args.skip_transformers or args.model):
        parser.error("--quantization needs --skip-transformers: tamis cannot take "
                     "transformers' bf16 weights once its own are quantized")
    if args.skip_transformers and args.skip_timing:
        parser.error("--skip-transformers leaves nothing to do with --skip-timing")
    return args


def main() -> None:
    args = parse_args()
    vllm = measured_vllm(args)
    rng = random.Random(args.seed)
    torch.manual_seed(args.seed)
    model_dir = Path(args.model) if args.model else \
        write_shape_config(args.shape, tempfile.mkdtemp(), eos_token_id=None)
    vocab = prompt_vocab_of(model_dir)
    print(torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu", "torch", torch.__version__,
          flush=True)

    hf, hf_times = None, [float("nan")]
    if not args.skip_transformers:
        hf = build_transformers(model_dir, args.dtype, pretrained=args.model is not None)
        hf_generate(hf, random_prompt(rng, 16, vocab), 4)   # warm-up
        if not args.skip_timing:
            prompt = random_prompt(rng, args.prompt_len, vocab)
            hf_times = time_it(lambda: hf_generate(hf, prompt, args.output_len), args.hf_repeats)

    llm = build_tamis(model_dir, hf, args)
    tamis_generate(llm, random_prompt(rng, 16, vocab), 8)   # warm-up
    tamis_times = [float("nan")]
    if not args.skip_timing:
        # Fresh prompts per repetition: a repeated prompt would hit the prefix cache.
        prompts = [random_prompt(rng, args.prompt_len, vocab) for _ in range(args.repeats)]
        it = iter(prompts)
        tamis_times = time_it(lambda: tamis_generate(llm, next(it), args.output_len),
                              args.repeats)

    greedy = [] if hf is None else check_greedy(llm, hf, model_dir, rng, args)
    result = dict(dtype=args.dtype, shape=args.shape, quantization=args.quantization,
                  hf_seconds=hf_times, tamis_seconds=tamis_times,
                  hf_tok_s=args.output_len / statistics.median(hf_times),
                  tamis_tok_s=args.output_len / statistics.median(tamis_times), greedy=greedy)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / f"w2_{args.dtype}.json").write_text(json.dumps(result, indent=1))
    if greedy:
        print_greedy(greedy, args)
    if not args.skip_timing:
        print_w2_table(result, vllm, args)


if __name__ == "__main__":
    main()
