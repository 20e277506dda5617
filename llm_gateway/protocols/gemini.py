"""Google's Gemini API as a wire protocol a target speaks (``generateContent``,
``streamGenerateContent?alt=sse``). No caller speaks it to the gateway: a request reaches a
Gemini target translated (``translate/gemini.py``); what this module says is how its
answers are read for the record (``read_gemini``: usageMetadata, finish reasons, errors)
and that its streams end with a chunk that has a finish reason, not ``[DONE]``."""

from __future__ import annotations

from llm_gateway.observe import ResponseFacts, StreamObserver
from llm_gateway.protocols.base import OpenAICompatible, data_frame
from llm_gateway.providers import Profile
from llm_gateway.providers.gemini import read_gemini


class Gemini(OpenAICompatible):
    name = "gemini"
    wire = "gemini"

    def response_facts(self, profile: Profile) -> ResponseFacts:
        return ResponseFacts(profile, read_gemini)

    def stream_observer(self, profile: Profile) -> StreamObserver:
        return StreamObserver(profile, read_gemini)

    def cap_end(self, facts: ResponseFacts, prompt_tokens: int, output_tokens: int,
                choices: int, now: float) -> list[bytes]:
        """A last chunk: ``MAX_TOKENS``, with the usage counted (no ``[DONE]`` here)."""
        return [data_frame({
            "candidates": [{"content": {"role": "model", "parts": []},
                            "finishReason": "MAX_TOKENS", "index": 0}],
            "usageMetadata": {"promptTokenCount": prompt_tokens,
                              "candidatesTokenCount": output_tokens,
                              "totalTokenCount": prompt_tokens + output_tokens},
            "modelVersion": facts.model or "", "responseId": facts.response_id or ""})]


GEMINI = Gemini()
