"""`tamis generate "PROMPT" [PROMPT ...]`: generate from the shell and print the text.

No ``--model`` uses the embedded SmolLM2-135M-Instruct. ``--chat`` wraps each prompt in
the model's chat template as a user message. Every engine flag of
``tamis.engine.arg_utils.add_engine_args`` applies (``--max-model-len``, ``--dtype``...).
"""
from __future__ import annotations

import argparse
import sys


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("generate", help="generate text for prompts given on the command line",
                                   description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("prompts", nargs="+", metavar="PROMPT")
    sampling = parser.add_argument_group("sampling")
    sampling.add_argument("--max-tokens", type=int, default=64)
    sampling.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (the default here)")
    sampling.add_argument("--top-p", type=float, default=1.0)
    sampling.add_argument("--top-k", type=int, default=0)
    sampling.add_argument("--min-p", type=float, default=0.0)
    sampling.add_argument("--sampling-seed", type=int, default=None, help="per-request sampling seed")
    sampling.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    sampling.add_argument("--ignore-eos", action="store_true")
    sampling.add_argument("--chat", action="store_true", help="apply the chat template")
    from tamis.engine.arg_utils import add_engine_args
    add_engine_args(parser)
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    import dataclasses

    from tamis.engine.config import EngineConfig
    from tamis.engine.llm import LLM
    from tamis.engine.sampling_params import SamplingParams

    try:
        params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature,
                                top_p=args.top_p, top_k=args.top_k, min_p=args.min_p,
                                seed=args.sampling_seed, stop=args.stop, ignore_eos=args.ignore_eos)
        with LLM(**dataclasses.asdict(EngineConfig.from_cli_args(args))) as llm:
            if args.chat:
                conversations = [[{"role": "user", "content": p}] for p in args.prompts]
                outputs = llm.chat(conversations, params, use_tqdm=False)
            else:
                outputs = llm.generate(args.prompts, params, use_tqdm=False)
    except (ValueError, FileNotFoundError) as exc:
        print(f"tamis generate: {exc}", file=sys.stderr)
        return 2
    for prompt, output in zip(args.prompts, outputs):
        if len(args.prompts) > 1:
            print(f"### {prompt}")
        print(output.outputs[0].text)
    return 0
