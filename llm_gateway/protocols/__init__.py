"""The client protocols the gateway speaks, one module each, and which operation of which
protocol a path is.

A path under the API root is an operation of a known protocol (chat, embeddings, the model
list, Anthropic's Messages, OpenAI's Responses), or any other endpoint an operator allows
(``allowed_endpoints``), answered as an OpenAI-compatible one (``OTHER``). The engine asks
the protocol for everything that differs between them (``base.OpenAICompatible`` says what
that is), and the operation for what differs between one protocol's endpoints: whether a
body names a model (a stored response's ``GET`` does not), whether it is billed (counting
tokens is not).
"""

from __future__ import annotations

from dataclasses import dataclass

from llm_gateway import caller_text
from llm_gateway.protocols.base import OpenAICompatible
from llm_gateway.protocols.chat import CHAT, Chat
from llm_gateway.protocols.embeddings import EMBEDDINGS, Embeddings
from llm_gateway.protocols.messages import MESSAGES, Messages
from llm_gateway.protocols.models import MODELS, Models
from llm_gateway.protocols.responses import RESPONSES, Responses

OTHER = OpenAICompatible()
# A path segment that names a resource (a response id, a model id).
RESOURCE = "{id}"


@dataclass(frozen=True, slots=True)
class Operation:
    """One endpoint's kind: its protocol, its name in usage records, whether its body is
    read (a JSON object naming a model), whether its output is billed (budgets reserve),
    whether its body takes an output cap (the budget's, written into it), whether a target
    of another protocol can take it (a translator writes it there: a token count or a
    compaction has none, and translated it would be a whole completion)."""

    protocol: OpenAICompatible
    name: str
    body: bool = True
    billed: bool = True
    capped: bool = True
    crosses: bool = True


OPERATIONS: dict[tuple[str, str], Operation] = {
    ("POST", "/chat/completions"): Operation(CHAT, "chat.completions"),
    ("POST", "/embeddings"): Operation(EMBEDDINGS, "embeddings"),
    ("GET", "/models"): Operation(MODELS, "models", body=False),
    ("GET", "/models/{id}"): Operation(MODELS, "models.retrieve", body=False),
    ("POST", "/messages"): Operation(MESSAGES, "messages"),
    ("POST", "/messages/count_tokens"): Operation(MESSAGES, "messages.count_tokens",
                                                  billed=False, crosses=False),
    ("POST", "/responses"): Operation(RESPONSES, "responses"),
    # Compaction takes no max_output_tokens (OpenAI refuses it as an unknown parameter).
    ("POST", "/responses/compact"): Operation(RESPONSES, "responses.compact", capped=False,
                                              crosses=False),
    ("POST", "/responses/input_tokens"): Operation(RESPONSES, "responses.input_tokens",
                                                   billed=False, crosses=False),
    ("GET", "/responses/{id}"): Operation(RESPONSES, "responses.retrieve", body=False),
    ("DELETE", "/responses/{id}"): Operation(RESPONSES, "responses.delete", body=False),
    ("POST", "/responses/{id}/cancel"): Operation(RESPONSES, "responses.cancel", body=False),
    ("GET", "/responses/{id}/input_items"): Operation(RESPONSES, "responses.input_items",
                                                      body=False),
}
# Every operation of a protocol answers errors in its shape, whatever the method. Claude
# Code asks its API host for /api/claude_code/settings and .../policy_limits before its
# first turn: refused (it tolerates that) in the shape it reads.
_PROTOCOL_BY_PREFIX = (("/messages", MESSAGES), ("/responses", RESPONSES),
                       ("/api/claude_code", MESSAGES),
                       ("/models", MODELS), ("/chat/completions", CHAT),
                       ("/embeddings", EMBEDDINGS))


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One endpoint the gateway serves (its path pattern), and what it is."""

    method: str
    path: str
    operation: Operation

    @property
    def protocol(self) -> OpenAICompatible:
        return self.operation.protocol


def operation_of(method: str, pattern: str) -> Operation:
    """What an allowed endpoint (``METHOD /path``, ``{id}`` for a resource) is."""
    return OPERATIONS.get((method, pattern)) or Operation(OTHER, "other")


def protocol_at(path: str) -> OpenAICompatible:
    """The protocol whose errors a request of ``path`` (relative to the API root) reads,
    served or not."""
    return next((protocol for prefix, protocol in _PROTOCOL_BY_PREFIX
                 if path == prefix or path.startswith(prefix + "/")), OTHER)


def matches(pattern: str, path: str) -> str | None:
    """The resource id ``path`` names where ``pattern`` has ``{id}`` ("" when the pattern
    names none), or None when the path is not of the pattern. An id is one path segment,
    admitted as any caller string is (caller_text)."""
    if RESOURCE not in pattern:
        return "" if pattern == path else None
    head, _, tail = pattern.partition(RESOURCE)
    if not path.startswith(head) or not path.endswith(tail) or len(path) <= len(head + tail):
        return None
    resource = path[len(head):len(path) - len(tail)]
    if "/" in resource or caller_text.refusal("id", resource, caller_text.MODEL_CHARS):
        return None
    return resource


__all__ = ["CHAT", "EMBEDDINGS", "MESSAGES", "MODELS", "OPERATIONS", "OTHER", "RESPONSES",
           "Chat", "Embeddings", "Endpoint", "Messages", "Models", "OpenAICompatible",
           "Operation", "Responses", "matches", "operation_of", "protocol_at"]
