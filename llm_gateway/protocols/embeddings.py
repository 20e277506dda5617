"""OpenAI's embeddings (``POST /embeddings``): the prompt is ``input`` (a string, a list of
strings, or token ids); no output, no stream."""

from __future__ import annotations

from llm_gateway.protocols.base import OpenAICompatible
from llm_gateway.tokens import estimate_input


class Embeddings(OpenAICompatible):
    name = "embeddings"
    wire = "embeddings"

    def prompt_tokens(self, payload: dict) -> int:
        return estimate_input(payload.get("input"))


EMBEDDINGS = Embeddings()
