"""OpenAI's chat completions (``POST /chat/completions``): a non-empty ``messages`` list of
objects with a ``role``, the output cap in ``max_tokens`` or ``max_completion_tokens``, ``n``
choices; the body each provider's profile wants (its own spelling of the cap, the stream
usage asked for, foreign fields refused before the call)."""

from __future__ import annotations

from llm_gateway import errors
from llm_gateway.errors import Rejection
from llm_gateway.protocols.base import OpenAICompatible
from llm_gateway.providers import Profile
from llm_gateway.tokens import estimate_messages


class Chat(OpenAICompatible):
    name = "chat.completions"
    wire = "chat"

    def check(self, payload: dict) -> Rejection | None:
        refused = super().check(payload)
        if refused is not None:
            return refused
        messages = payload.get("messages")
        if not isinstance(messages, list) or not messages:
            return errors.invalid_request_body("'messages' must be a non-empty list.")
        for index, message in enumerate(messages):
            if not isinstance(message, dict) or not isinstance(message.get("role"), str):
                return errors.invalid_request_body(
                    f"messages[{index}] must be an object with a 'role'.")
        return None

    def prompt_tokens(self, payload: dict) -> int:
        return estimate_messages(payload["messages"])

    def upstream_payload(self, profile: Profile, payload: dict, *, stream: bool) -> dict:
        return profile.prepare(payload, stream=stream)


CHAT = Chat()
