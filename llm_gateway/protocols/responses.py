"""OpenAI's Responses API (``POST /responses`` and what hangs off a stored response), spoken
natively: Codex CLI and OpenAI's Agents SDK.

The body: ``input`` (a string or items) and ``instructions`` make the prompt; the output
cap is ``max_output_tokens`` (``max_tokens`` is no parameter of it); no ``n``. Usage is the
response's (a JSON answer's, or that of ``response.completed``, ``response.incomplete`` or
``response.failed``, which end a stream), read as OpenAI's profile reads it (cached input
tokens in ``input_tokens_details``, reasoning in ``output_tokens_details``). Errors are
OpenAI's shape; in a stream, an ``error`` event carrying the next ``sequence_number``.
"""

from __future__ import annotations

import json

from llm_gateway import caller_text, errors
from llm_gateway.errors import Rejection
from llm_gateway.observe import ResponseFacts, StreamObserver
from llm_gateway.protocols.base import (
    OpenAICompatible,
    check_stream_and_caps,
    check_user,
    event_frame,
)
from llm_gateway.providers import Profile
from llm_gateway.tokens import TOKENS_PER_MESSAGE, estimate_text

# The events that end a stream, with the response in its final state.
TERMINAL_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed"})
# Events whose ``delta`` is generated text (what a cut stream is metered from).
_TEXT_DELTAS = frozenset({"response.output_text.delta", "response.function_call_arguments.delta",
                          "response.reasoning_summary_text.delta", "response.reasoning_text.delta",
                          "response.custom_tool_call_input.delta", "response.refusal.delta"})


class Responses(OpenAICompatible):
    name = "responses"
    wire = "responses"
    cap_fields = ("max_output_tokens",)

    def check(self, payload: dict) -> Rejection | None:
        given = payload.get("input")
        if given is not None and not isinstance(given, str | list):
            return errors.invalid_request_body("'input' must be a string or a list of items.")
        refused = (check_stream_and_caps(payload, self.cap_fields)
                   or check_user("user", payload.get("user")))
        if refused is not None:
            return refused
        previous = payload.get("previous_response_id")
        if previous is not None and (not isinstance(previous, str) or caller_text.refusal(
                "previous_response_id", previous, caller_text.MODEL_CHARS)):
            return errors.invalid_request_body("'previous_response_id' must be a response id.")
        return None

    def body_tags(self, payload: dict) -> dict[str, str]:
        return caller_text.metadata_tags(payload.get("metadata"))

    def choices(self, payload: dict) -> int:
        return 1

    def prompt_tokens(self, payload: dict) -> int:
        instructions = payload.get("instructions")
        total = estimate_text(instructions) if isinstance(instructions, str) else 0
        given = payload.get("input")
        if isinstance(given, str):
            return total + estimate_text(given)
        for item in given if isinstance(given, list) else ():
            total += TOKENS_PER_MESSAGE + _item_tokens(item)
        return total

    def wants_stream_usage(self, payload: dict) -> bool:
        return True

    def relays(self, payload: dict, wants_usage: bool) -> bool:
        return True

    def upstream_payload(self, profile: Profile, payload: dict, *, stream: bool) -> dict:
        return payload

    def response_facts(self, profile: Profile) -> ResponseFacts:
        return ResponseFacts(profile, read_response)

    def stream_observer(self, profile: Profile) -> StreamObserver:
        return StreamObserver(profile, read_response)

    def cap_end(self, facts: ResponseFacts, prompt_tokens: int, output_tokens: int,
                choices: int, now: float) -> list[bytes]:
        """``response.incomplete`` (reason ``max_output_tokens``) with the usage counted.
        Its ``output`` is empty: the items streamed so far are not kept to repeat them."""
        last = facts.state.get("sequence")
        response = {
            "id": facts.response_id or "", "object": "response", "created_at": int(now),
            "status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"},
            "model": facts.model or "", "output": [], "error": None,
            "usage": {"input_tokens": prompt_tokens, "input_tokens_details": {"cached_tokens": 0},
                      "output_tokens": output_tokens,
                      "output_tokens_details": {"reasoning_tokens": 0},
                      "total_tokens": prompt_tokens + output_tokens}}
        return [event_frame("response.incomplete", {
            "type": "response.incomplete", "response": response,
            "sequence_number": last + 1 if isinstance(last, int) else 0})]

    def stream_error(self, code: str, message: str, facts: ResponseFacts | None = None) -> bytes:
        last = facts.state.get("sequence") if facts is not None else None
        event = {"type": "error", "code": code, "message": message, "param": None,
                 "sequence_number": last + 1 if isinstance(last, int) else 0}
        return b"event: error\ndata: " + json.dumps(event).encode() + b"\n\n"


RESPONSES = Responses()


def _item_tokens(item: object) -> int:
    """An input item: a message (its content a string or parts), a tool call's arguments,
    a tool's output."""
    if isinstance(item, str):
        return estimate_text(item)
    if not isinstance(item, dict):
        return 0
    content = item.get("content")
    if isinstance(content, str):
        return estimate_text(content)
    total = 0
    for part in content if isinstance(content, list) else ():
        if isinstance(part, dict) and isinstance(part.get("text"), str):
            total += estimate_text(part["text"])
    for name in ("arguments", "output", "input"):
        if isinstance(item.get(name), str):
            total += estimate_text(item[name])
    return total


def read_response(facts: ResponseFacts, payload: dict) -> None:
    """A response object (JSON) or one stream event: ids, model, status, usage, text seen,
    the first error, the end (a terminal event)."""
    kind = payload.get("type")
    sequence = payload.get("sequence_number")
    if isinstance(sequence, int) and not isinstance(sequence, bool):
        facts.state["sequence"] = sequence
    if kind == "error" and facts.error is None:
        facts.error = {"message": str(payload.get("message") or ""), "type": None,
                       "code": payload.get("code") if isinstance(payload.get("code"), str)
                       else None}
        return
    response = payload if payload.get("object") == "response" else payload.get("response")
    if isinstance(response, dict):
        _read_object(facts, response, final=kind in TERMINAL_EVENTS or kind is None)
    if kind in _TEXT_DELTAS and isinstance(payload.get("delta"), str):
        facts.text_chars += len(payload["delta"])
    elif kind in TERMINAL_EVENTS:
        facts.done = True


def _read_object(facts: ResponseFacts, response: dict, *, final: bool) -> None:
    if facts.response_id is None and isinstance(response.get("id"), str):
        facts.response_id = response["id"]
    if not facts.model and isinstance(response.get("model"), str):
        facts.model = response["model"]
    error = response.get("error")
    if isinstance(error, dict) and facts.error is None:
        code = error.get("code")
        facts.error = {"message": str(error.get("message") or ""), "type": None,
                       "code": code if isinstance(code, str) else None}
    if not final:
        return
    status = response.get("status")
    if isinstance(status, str):
        facts.finish_reasons.append(status)
    usage = facts.profile.usage(response)
    if usage is not None:
        facts.usage = usage
    if not facts.text_chars:  # a JSON answer: its output, as a stream would have sent it
        for item in response.get("output") or ():
            facts.text_chars += _output_chars(item)


def _output_chars(item: object) -> int:
    if not isinstance(item, dict):
        return 0
    # A message's content, and a reasoning item's summary and content: output, all of it.
    total = sum(len(part["text"]) for name in ("content", "summary")
                for part in item.get(name) or ()
                if isinstance(part, dict) and isinstance(part.get("text"), str))
    for name in ("arguments", "input"):
        if isinstance(item.get(name), str):
            total += len(item[name])
    return total
