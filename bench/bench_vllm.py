"""vLLM as the peer in the GPU benchmarks: W1 offline throughput and W2 batch-1 latency on
the same workloads as bench_offline.py / bench_latency.py, one vLLM instance for both.

vLLM is not a dependency of tamis: it is installed beside it from wheels
(``bench/device/make_bundle.py`` and ``carried.sh`` for a machine without a package
index) and imported only here. Its defaults are kept (torch.compile, CUDA graphs, prefix
caching, chunked prefill) except what the workload fixes: dummy
bf16 weights at the ``--shape`` tamis gets (default Llama-3.1-8B; bench/shapes.py), the
same ``--quantization``, token-id prompts (no tokenizer), greedy, EOS ignored,
``max_model_len`` and ``max_num_seqs`` as tamis gets them. Prompts are fresh for every
timed pass, so vLLM's prefix cache cannot inflate its figure.

    python bench/bench_vllm.py [--shape mixtral-8x7b --quantization fp8] [--json OUT/vllm.json]
    python bench/bench_offline.py --engines tamis,vllm     # as a W1 row
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from llama8b import add_w1_workload_args, make_prompts  # noqa: E402
from shapes import DEFAULT_SHAPE, add_shape_args, prompt_vocab, write_shape_config  # noqa: E402


def _prompts(num: int, lo: int, hi: int, seed: int, vocab: int) -> list[dict]:
    return [{"prompt_token_ids": p} for p in make_prompts(num, lo, hi, seed, vocab)]


def build_vllm(max_model_len: int, max_num_seqs: int, enforce_eager: bool = False,
               shape: str = DEFAULT_SHAPE, quantization: str | None = None):
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")   # flashinfer is not in the bundle
    from vllm import LLM
    model_dir = write_shape_config(shape, tempfile.mkdtemp())
    t0 = time.perf_counter()
    llm = LLM(model=str(model_dir), load_format="dummy", dtype="bfloat16",
              quantization=quantization, skip_tokenizer_init=True,
              max_model_len=max_model_len, max_num_seqs=max_num_seqs,
              gpu_memory_utilization=0.9, enforce_eager=enforce_eager)
    return llm, time.perf_counter() - t0


def _generate(llm, prompts: list[dict], output_len: int) -> tuple[float, int]:
    from vllm import SamplingParams
    params = SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True,
                            detokenize=False)
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    return time.perf_counter() - t0, sum(len(o.outputs[0].token_ids) for o in outs)


def run_w1(llm, prompts: list[list[int]], output_len: int, seed: int, vocab: int) -> dict:
    """W1 on the caller's prompts (the same ones tamis gets), after a warm-up on others
    (ids below ``vocab``)."""
    _generate(llm, _prompts(8, 16, 64, seed + 1, vocab), 16)
    seconds, generated = _generate(llm, [{"prompt_token_ids": p} for p in prompts], output_len)
    return dict(seconds=seconds, output_tokens=generated, output_tok_s=generated / seconds)


def run_w2(llm, prompt_len: int, output_len: int, repeats: int, seed: int, vocab: int) -> dict:
    """W2: one request at a time, a fresh random prompt (ids below ``vocab``) each
    repetition; median tok/s."""
    times = []
    for r in range(repeats):
        prompt = _prompts(1, prompt_len, prompt_len, seed + 50 + r, vocab)
        seconds, generated = _generate(llm, prompt, output_len)
        assert generated == output_len, generated
        times.append(seconds)
    return dict(seconds=times, output_tok_s=output_len / statistics.median(times))


def run_all(args, w1_prompts: list[list[int]]) -> dict:
    if getattr(args, "kernel_profile", False):   # its engine core in this process, traced
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    import vllm
    llm, startup = build_vllm(args.max_model_len, args.max_num_seqs, args.enforce_eager,
                              args.shape, args.quantization)
    vocab = prompt_vocab(args.shape)
    result = dict(engine=f"vllm {vllm.__version__}", shape=args.shape,
                  quantization=args.quantization, startup_s=startup,
                  **run_w1(llm, w1_prompts, args.output_len, args.seed, vocab))
    result["w2"] = run_w2(llm, 128, 256, 3, args.seed, vocab)
    if getattr(args, "kernel_profile", False):
        from kernel_profile import kernel_profile
        result["kernel_profile"] = {}
        again = _prompts(len(w1_prompts), args.min_prompt, args.max_prompt, args.seed + 9, vocab)
        with kernel_profile(result["kernel_profile"]):
            _generate(llm, again, args.output_len)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_w1_workload_args(parser)
    add_shape_args(parser)
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--json", default="vllm.json")
    args = parser.parse_args()
    prompts = make_prompts(args.num_prompts, args.min_prompt, args.max_prompt, args.seed,
                           prompt_vocab(args.shape))
    result = run_all(args, prompts)
    Path(args.json).write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items()}, indent=1))


if __name__ == "__main__":
    main()
