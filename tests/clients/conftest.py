"""One live ``tamis serve`` (the embedded SmolLM2 on CPU) for every client test in this
folder, started on first use and stopped after the folder's last test."""
from __future__ import annotations

import pytest
from langchain_openai import ChatOpenAI
from live_server import MODEL_NAME, server_fixture

from .client_setup import KEY, MAX_TOKENS

server = server_fixture("package", KEY)


@pytest.fixture(scope="package")
def chat_model(server):
    """LangChain's ChatOpenAI pointed at the server, greedy."""
    return ChatOpenAI(base_url=server + "/v1", api_key=KEY, model=MODEL_NAME,
                      max_tokens=MAX_TOKENS, temperature=0, max_retries=0, timeout=120)
