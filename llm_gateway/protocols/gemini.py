"""Google's Gemini API as a wire protocol a target speaks (``generateContent``,
``streamGenerateContent?alt=sse``). No caller speaks it to the gateway: a request reaches a
Gemini target translated (``translate/gemini.py``); what this module says is how its
answers are read for the record (``read_gemini``: usageMetadata, finish reasons, errors)
and that its streams end with a chunk that has a finish reason, not ``[DONE]``."""

from __future__ import annotations

from llm_gateway.observe import ResponseFacts, StreamObserver
from llm_gateway.protocols.base import OpenAICompatible
from llm_gateway.providers import Profile
from llm_gateway.providers.gemini import read_gemini


class Gemini(OpenAICompatible):
    name = "gemini"
    wire = "gemini"

    def response_facts(self, profile: Profile) -> ResponseFacts:
        return ResponseFacts(profile, read_gemini)

    def stream_observer(self, profile: Profile) -> StreamObserver:
        return StreamObserver(profile, read_gemini)


GEMINI = Gemini()
