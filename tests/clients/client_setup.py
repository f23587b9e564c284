"""What the client tests share: the server's key, the token budget, and what they ask the
model for (bounded strings, so that a constrained answer fits in a few dozen tokens of the
tiny model, and one tool)."""
from __future__ import annotations

from pydantic import BaseModel, Field

KEY = "sk-tamis-clients"
# Enough for the constrained answers asked here (~50 tokens); an answer cut by the limit is
# unparseable whatever the constraint, so it must not bind.
MAX_TOKENS = 96
PROMPT = "Lyon is a city in France."


class City(BaseModel):
    """A city and the country it is in."""

    name: str = Field(max_length=20)
    country: str = Field(max_length=20)


def get_weather(city: str) -> str:
    """Get the current weather in a city."""
    return f"sunny in {city}"
