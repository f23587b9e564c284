"""LlamaIndex's OpenAI-like LLM asking a tamis server for a ``City``, both ways LlamaIndex
offers: ``structured_predict`` and ``as_structured_llm(...).chat``. Prints one JSON line per
call: ``{"call", "type", "value"}`` (the returned object's class name and its fields).

Runs in the environment that holds LlamaIndex (``test_llamaindex.py`` builds it):
    python llamaindex_client.py BASE_URL API_KEY MODEL MAX_TOKENS
"""
from __future__ import annotations

import json
import sys

from client_setup import PROMPT, City
from llama_index.core.llms import ChatMessage
from llama_index.core.prompts import PromptTemplate
from llama_index.llms.openai_like import OpenAILike


def main(base_url: str, api_key: str, model: str, max_tokens: int) -> None:
    # is_function_calling_model: LlamaIndex then asks for the object as a required tool call
    # (a schema the server enforces) instead of parsing free text.
    llm = OpenAILike(model=model, api_base=base_url + "/v1", api_key=api_key,
                     is_chat_model=True, is_function_calling_model=True, context_window=2048,
                     max_tokens=max_tokens, temperature=0, max_retries=0, timeout=120)
    answers = {
        "structured_predict": llm.structured_predict(
            City, PromptTemplate("Extract the city: {text}"), text=PROMPT),
        "as_structured_llm": llm.as_structured_llm(City).chat(
            [ChatMessage(role="user", content=PROMPT)]).raw,
    }
    for call, answer in answers.items():
        print(json.dumps({"call": call, "type": type(answer).__name__,
                          "value": answer.model_dump()}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
