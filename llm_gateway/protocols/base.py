"""A client protocol: everything the engine needs to know of the API a caller speaks, in
one object, so that the engine holds every rule once and asks the protocol where the
protocols differ.

What a protocol answers:

- **the body**: the checks of its own fields (``check``), what policy reads from it (the
  model, whether it streams, the output cap and its field, the number of choices, the
  prompt's size) and how the output cap is written back (``with_output_cap``);
- **the way out**: the body a provider of a given profile takes (``upstream_payload``:
  chat's providers spell some fields their own way, and refuse some);
- **the way back**: what a response says of itself (``response_facts``, fed each decoded
  body or stream event: ids, finish reasons, usage, the first error, whether a stream
  reached its end), which frames of a stream the client gets, an upstream error rewritten
  into the protocol's shape, and the gateway's own errors in that shape (``error_shape``;
  in a stream already under way: ``stream_error``).

``OpenAICompatible`` is the behaviour of any OpenAI-style endpoint an operator allows
beyond the known ones (``allowed_endpoints``): OpenAI's error shape, a stream that ends with
``data: [DONE]``, usage read by the provider's profile. The known protocols refine it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from llm_gateway import caller_text, errors, jsonio
from llm_gateway.errors import ErrorShape, Rejection, openai_error
from llm_gateway.http_types import IncomingRequest
from llm_gateway.observe import ResponseFacts, StreamObserver, read_openai
from llm_gateway.providers import Profile
from llm_gateway.tokens import estimate_prompt

# OpenAI's own bound on a chat request's choices.
MAX_CHOICES = 128


def check_stream_and_caps(payload: dict, caps: tuple[str, ...]) -> Rejection | None:
    """``stream`` a boolean, each output cap a positive integer, where present."""
    if not isinstance(payload.get("stream", False), bool):
        return errors.invalid_request_body("'stream' must be a boolean when present.")
    for cap in caps:
        value = payload.get(cap)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 1):
            return errors.invalid_request_body(f"'{cap}' must be a positive integer.")
    return None


def check_messages(payload: dict) -> Rejection | None:
    """A non-empty ``messages`` list of objects with a ``role`` (chat's, Anthropic's)."""
    messages = payload.get("messages")
    if not isinstance(messages, list) or not messages:
        return errors.invalid_request_body("'messages' must be a non-empty list.")
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            return errors.invalid_request_body(
                f"messages[{index}] must be an object with a 'role'.")
    return None


def check_user(name: str, user: object) -> Rejection | None:
    """The end user's id (``user``, ``metadata.user_id``): a string, admitted as any
    caller string is."""
    if user is None:
        return None
    if not isinstance(user, str):
        return errors.invalid_request_body(f"'{name}' must be a string when present.")
    problem = caller_text.refusal(name, user, caller_text.USER_CHARS) if user else None
    return errors.invalid_request_body(problem) if problem else None


def data_frame(payload: dict) -> bytes:
    return b"data: " + jsonio.dumps(payload) + b"\n\n"


def event_frame(event: str, payload: dict) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + jsonio.dumps(payload) + b"\n\n"


class OpenAICompatible:
    """An OpenAI-compatible endpoint with no rules of its own (``name``: the record's
    ``endpoint``)."""

    name = "other"
    # The protocol a provider must speak to take the request (a provider's ``protocols:``);
    # None: any provider (a model list, an operator's own endpoint).
    wire: str | None = None
    # The output cap's fields, in the order they are looked for.
    cap_fields: tuple[str, ...] = ("max_tokens", "max_completion_tokens")
    error_shape: ErrorShape = staticmethod(openai_error)  # type: ignore[assignment]
    # Whether the model the answer names is the upstream's (a model list names many).
    names_upstream_model = True
    # Whether a response without usage is metered from an estimate.
    estimates_usage = True

    # ---- the body ---------------------------------------------------------------------

    def check(self, payload: dict) -> Rejection | None:
        """The protocol's own rules for a body with a valid ``model``; None: it passes."""
        if (refused := check_user("user", payload.get("user"))) is not None:
            return refused
        choices = payload.get("n")
        if choices is not None and (isinstance(choices, bool) or not isinstance(choices, int)
                                    or not 1 <= choices <= MAX_CHOICES):
            return errors.invalid_request_body(
                f"'n' must be an integer from 1 to {MAX_CHOICES} when present.")
        return check_stream_and_caps(payload, self.cap_fields)

    def attribution(self, header_tags: dict[str, str],
                    payload: dict | None) -> tuple[dict[str, str], str | None]:
        """The record's tags (the header's, then the body's) and end user."""
        if not payload:
            return header_tags, None
        return (caller_text.merged_tags(header_tags, self.body_tags(payload)),
                self.end_user(payload))

    def end_user(self, payload: dict) -> str | None:
        """The end user the body names (admitted by ``check``), for the record."""
        user = payload.get("user")
        return user if isinstance(user, str) and user else None

    def body_tags(self, payload: dict) -> dict[str, str]:
        """Tags the body carries (a protocol's ``metadata``), for the record."""
        return {}

    def output_cap(self, payload: dict) -> int | None:
        """The output cap the caller asked for (per choice), if any."""
        for cap in self.cap_fields:
            if payload.get(cap):
                return int(payload[cap])
        return None

    def choices(self, payload: dict) -> int:
        """How many answers the request asks for, each billed in whole."""
        return payload.get("n") or 1

    def with_output_cap(self, payload: dict, cap: int) -> dict:
        """``payload`` with its output cap set to ``cap``, in the field the caller used (a
        provider's profile may spell it otherwise on the way out)."""
        used = next((name for name in self.cap_fields[1:] if name in payload), self.cap_fields[0])
        return {**payload, used: cap}

    def prompt_tokens(self, payload: dict) -> int:
        return estimate_prompt(payload)

    def wants_stream_usage(self, payload: dict) -> bool:
        """Whether the caller asked for the usage chunk of a stream (OpenAI's
        ``stream_options.include_usage``): the gateway always meters it, but relays it only
        when asked."""
        options = payload.get("stream_options")
        return isinstance(options, dict) and options.get("include_usage") is True

    # ---- the way out ------------------------------------------------------------------

    def upstream_payload(self, profile: Profile, payload: dict, *, stream: bool) -> dict:
        """The body as a provider of ``profile`` takes it (the same dict when nothing
        changes); raises UnsupportedParameter for what it cannot take."""
        return payload

    # ---- the way back -----------------------------------------------------------------

    def response_facts(self, profile: Profile) -> ResponseFacts:
        return ResponseFacts(profile, read_openai)

    def stream_observer(self, profile: Profile) -> StreamObserver:
        return StreamObserver(profile, read_openai)

    def relays(self, payload: dict, wants_usage: bool) -> bool:
        """Whether the client gets this stream event: not the usage-only chunk
        (``choices: []``) a client that did not ask for it would trip on."""
        return wants_usage or "usage" not in payload or payload.get("choices") != []

    def client_body(self, request: IncomingRequest, body: bytes, aliases: Iterable[str],
                    allows: Callable[[object], bool]) -> bytes | None:
        """A whole answer the protocol rewrites for the client (a model list), or None:
        the provider's bytes go as they came, and are observed later."""
        return None

    def local_answer(self, request: IncomingRequest, aliases: Iterable[str],
                     allows: Callable[[object], bool], passthrough: bool,
                     ) -> bytes | Rejection | None:
        """An answer the gateway gives without asking a provider, or None (the usual)."""
        return None

    def upstream_error(self, profile: Profile, body: bytes, status: int) -> bytes:
        """A provider's error answer in this protocol's shape, its message verbatim."""
        return profile.error_body(body, status)

    def stream_error(self, code: str, message: str, facts: ResponseFacts | None = None) -> bytes:
        """The end of a stream that failed after its status was sent (``facts``: what the
        stream said so far): an error event, then ``[DONE]``, so that SDKs raise instead of
        ending quietly."""
        kind = errors.CATALOGUE[code]
        return (b"data: " + self.error_shape(kind.status, kind.type, code, message)
                + b"\n\ndata: [DONE]\n\n")

    def cap_end(self, facts: ResponseFacts, prompt_tokens: int, output_tokens: int,
                choices: int, now: float) -> list[bytes]:
        """The frames that end a stream at its output cap, as a provider of this protocol
        ends one that reached it: for the gateway to send when the upstream did not stop
        (``facts``: what the stream said so far; the tokens: what the gateway counted).
        Written in the wire protocol and relayed as the upstream's frames are, so that a
        translated stream ends in the caller's. Chat's: each choice's ``length`` finish,
        the usage chunk, ``[DONE]``."""
        head = {"id": facts.response_id or "", "object": "chat.completion.chunk",
                "created": int(now), "model": facts.model or ""}
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": output_tokens,
                 "total_tokens": prompt_tokens + output_tokens}
        finishes = [{**head, "choices": [{"index": index, "delta": {},
                                          "finish_reason": "length"}]}
                    for index in range(choices)]
        return [*(data_frame(chunk) for chunk in finishes),
                data_frame({**head, "choices": [], "usage": usage}), b"data: [DONE]\n\n"]

    def credential(self, request: IncomingRequest) -> str | None:
        """The gateway key, as an Authorization value: ``Authorization: Bearer`` (OpenAI's
        SDKs, recent Anthropic ones), ``x-api-key`` (Claude Code with ANTHROPIC_API_KEY) or
        ``api-key`` (Azure's clients); none of them is ever forwarded."""
        authorization = request.header("authorization")
        if authorization:
            return authorization
        bare = request.header("x-api-key") or request.header("api-key")
        return f"Bearer {bare.strip()}" if bare and bare.strip() else None

    def error_shape_for(self, request: IncomingRequest) -> ErrorShape:
        """The error shape the caller reads (a model list asked by an Anthropic SDK is
        Anthropic's)."""
        return self.error_shape

    def shaped(self, rejection: Rejection, request: IncomingRequest) -> Rejection:
        """``rejection`` written in the shape its caller reads."""
        rejection.shape = self.error_shape_for(request)
        return rejection
