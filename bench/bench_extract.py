"""``LLM.extract`` against unconstrained generation of the same lengths (tamis alone).

256 texts (decoded random token ids, 128-512 tokens each), one pydantic schema, greedy.
A pass times ``LLM.extract`` over the texts, then ``LLM.chat`` over the very same
conversations without a constraint, each request held to the length its extraction
produced (EOS ignored): the same tokens in and out, so the ratio of the two times is what
the constraint costs. The prefix cache is emptied before each timed half, so both pay the
same prefill (the texts' shared instruction is still cached within a half, for both). Two
passes on fresh texts: the first reaches most automaton states for the first time, the
second finds their mask rows cached (a server extracting with one schema all day).
``--max-tokens`` (default 1,000) leaves room for what random weights write where the
schema has no bound (the digits of a number, whitespace). Llama-3.1-8B shape with dummy
bf16 weights and SmolLM2's tokenizer.

    python bench/bench_extract.py [--tokenizer DIR] [--num-texts 256] [--passes 2] [--tiny]
                                  [--schema FILE]

``--tiny`` runs a 2-layer model of width 256 (a smoke test on a CPU).
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_structured_gpu import VOCAB, model_folder  # noqa: E402
from llama8b import make_prompts  # noqa: E402


def order_model():
    """The pydantic schema extracted by default: an order with 1-6 line items."""
    from pydantic import BaseModel, ConfigDict, Field

    class LineItem(BaseModel):
        model_config = ConfigDict(extra="forbid")   # no free-form keys: outputs end
        sku: str = Field(max_length=12)
        quantity: int = Field(ge=1, le=999)
        unit_price: float = Field(ge=0, le=10000)

    class Order(BaseModel):
        model_config = ConfigDict(extra="forbid")
        customer: str = Field(max_length=24)
        city: str = Field(max_length=16)
        items: list[LineItem] = Field(min_length=1, max_length=6)
        paid: bool
        priority: int = Field(ge=0, le=5)

    return Order


def texts_of(num: int, seed: int, tokenizer) -> list[str]:
    """``num`` texts of 128-512 random tokens, decoded."""
    ids = make_prompts(num, 128, 512, seed, vocab=VOCAB, first_id=256)
    return [tokenizer.decode(p, skip_special_tokens=True) for p in ids]


def run_pass(llm, schema, texts: list[str], max_tokens: int) -> dict:
    from tamis.engine.sampling_params import SamplingParams
    captured = []
    chat = llm.chat

    def recording_chat(*args, **kwargs):
        outputs = chat(*args, **kwargs)
        captured.extend(outputs)
        return outputs

    llm.chat = recording_chat
    llm.reset_prefix_cache()
    start = time.perf_counter()
    try:
        objects = llm.extract(texts, schema, SamplingParams(temperature=0.0,
                                                          max_tokens=max_tokens))
    finally:
        del llm.chat
    extract_s = time.perf_counter() - start
    assert len(objects) == len(texts)
    lengths = [len(o.outputs[0].token_ids) for o in captured]
    prompts = [o.prompt_token_ids for o in captured]
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in lengths]
    # The very same prompts: without a reset their every block would be a prefix-cache hit,
    # and the unconstrained pass would skip the prefill the extraction paid for.
    llm.reset_prefix_cache()
    start = time.perf_counter()
    plain = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    generate_s = time.perf_counter() - start
    assert [len(o.outputs[0].token_ids) for o in plain] == lengths
    tokens = sum(lengths)
    return {"output_tokens": tokens, "extract_s": round(extract_s, 3),
            "generate_s": round(generate_s, 3),
            "extract_tok_s": round(tokens / extract_s, 1),
            "generate_tok_s": round(tokens / generate_s, 1),
            "ratio": round(generate_s / extract_s, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokenizer", default=None,
                        help="folder with SmolLM2's tokenizer (default: the embedded model's)")
    parser.add_argument("--num-texts", type=int, default=256)
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=1000)
    parser.add_argument("--schema", default=None, metavar="FILE",
                        help="a JSON schema file to extract with (default: the pydantic Order)")
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--out", default=None, help="write the figures here as JSON")
    args = parser.parse_args()
    if args.tokenizer is None:
        from tamis.engine.embedded import default_model_path
        args.tokenizer = str(default_model_path())
    from tamis.engine.llm import LLM
    llm = LLM(model=str(model_folder(args.tokenizer, args.tiny)), load_format="dummy",
              dtype="float32" if args.tiny else "bfloat16", max_model_len=2048,
              max_num_seqs=256, gpu_memory_utilization=0.9)
    tokenizer = llm.get_tokenizer()
    schema = json.loads(Path(args.schema).read_text()) if args.schema else order_model()
    rng = random.Random(args.seed)
    run_pass(llm, schema, texts_of(8, rng.randrange(1 << 30), tokenizer), args.max_tokens)   # warm-up
    passes = []
    for index in range(args.passes):
        figures = run_pass(llm, schema, texts_of(args.num_texts, rng.randrange(1 << 30), tokenizer),
                           args.max_tokens)
        passes.append(figures)
        print(f"pass {index + 1}: {json.dumps(figures)}", flush=True)
    print("| pass | output tokens | extract tok/s | unconstrained, same lengths, tok/s | ratio |")
    print("|---|---|---|---|---|")
    for index, p in enumerate(passes, start=1):
        print(f"| {index} | {p['output_tokens']:,} | {p['extract_tok_s']:,.0f} | "
              f"{p['generate_tok_s']:,.0f} | {p['ratio']:.2f} |")
    if args.out:
        Path(args.out).write_text(json.dumps(passes))


if __name__ == "__main__":
    main()
