"""OpenAI's chat completions (``POST /chat/completions``): a non-empty ``messages`` list of
objects with a ``role``, the output cap in ``max_tokens`` or ``max_completion_tokens``, ``n``
choices; the body each provider's profile wants (its own spelling of the cap, the stream
usage asked for, foreign fields refused before the call)."""

from __future__ import annotations

from llm_gateway import caller_text
from llm_gateway.errors import Rejection
from llm_gateway.protocols.base import OpenAICompatible, check_messages
from llm_gateway.providers import Profile
from llm_gateway.tokens import estimate_messages


class Chat(OpenAICompatible):
    name = "chat.completions"
    wire = "chat"

    def check(self, payload: dict) -> Rejection | None:
        return super().check(payload) or check_messages(payload)

    def body_tags(self, payload: dict) -> dict[str, str]:
        return caller_text.metadata_tags(payload.get("metadata"))

    def prompt_tokens(self, payload: dict) -> int:
        return estimate_messages(payload["messages"])

    def upstream_payload(self, profile: Profile, payload: dict, *, stream: bool) -> dict:
        return profile.prepare(payload, stream=stream)


CHAT = Chat()
