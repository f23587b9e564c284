"""Offline schema extraction with tamis: every output is valid JSON for the schema.

    python examples/offline_extraction.py
"""
from pydantic import BaseModel

from tamis.engine.llm import LLM


class Person(BaseModel):
    name: str
    age: int
    city: str


def main() -> None:
    llm = LLM()   # the embedded SmolLM2-135M-Instruct; pass model=... for another one
    texts = [
        "Alice Martin, 34, moved to Lyon last spring.",
        "Our new colleague is Bob, a 27 year old engineer from Oslo.",
    ]
    for text, person in zip(texts, llm.extract(texts, Person)):
        print(f"{text!r}\n  -> {person!r}")


if __name__ == "__main__":
    main()
