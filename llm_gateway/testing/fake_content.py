"""What the fake upstream answers with: deterministic replies, usage, cost, embeddings and the
model catalogue, as plain JSON-ready values (no I/O), so tests can predict every byte."""

import base64
import hashlib
import secrets
import struct
import uuid
from dataclasses import dataclass, field

DEFAULT_FAKE_API_KEY = "sk-fake-upstream"
# The key of its usage and cost report APIs (a provider's admin key), which nothing else takes.
DEFAULT_FAKE_ADMIN_KEY = "sk-fake-admin"
BILLING_SECRET = "you should never see this through the gateway"

# Every reply chunk is "This is chunk N of the fake reply." -- eight words, which is also the number
# of completion tokens the fake charges per chunk.
WORDS_PER_CHUNK = 8

# Prices in the ballpark of Venice's llama-3.3-70b. The DIEM rates deliberately differ from the USD
# rates so a test can tell which of the two fields a gateway actually read.
USD_PER_PROMPT_TOKEN = 0.7e-6
USD_PER_COMPLETION_TOKEN = 2.8e-6
DIEM_PER_PROMPT_TOKEN = 0.5e-6
DIEM_PER_COMPLETION_TOKEN = 2.0e-6

DEFAULT_EMBEDDING_DIMENSIONS = 8


@dataclass(frozen=True)
class FakeModel:
    id: str
    type: str  # Venice's model type: "text" or "embedding"
    created: int


FAKE_MODELS: tuple[FakeModel, ...] = (
    FakeModel("llama-3.3-70b", "text", 1733768349),
    FakeModel("venice-uncensored", "text", 1742262554),
    FakeModel("qwen3-4b", "text", 1745903059),
    FakeModel("text-embedding-bge-m3", "embedding", 1739468485),
)


def fake_reply_chunk(index: int) -> str:
    """The content of stream chunk ``index``; chunks after the first carry a leading space."""
    sentence = f"This is chunk {index} of the fake reply."
    return sentence if index == 0 else " " + sentence


def fake_reply_text(chunk_count: int) -> str:
    """The whole reply: what a non-stream answer contains and what the stream chunks add up to."""
    return "".join(fake_reply_chunk(index) for index in range(chunk_count))


def fake_cost(prompt_tokens: int, completion_tokens: int) -> dict[str, float]:
    """Venice's ``usage.cost`` object as the fake computes it."""
    usd = prompt_tokens * USD_PER_PROMPT_TOKEN + completion_tokens * USD_PER_COMPLETION_TOKEN
    diem = prompt_tokens * DIEM_PER_PROMPT_TOKEN + completion_tokens * DIEM_PER_COMPLETION_TOKEN
    # Rounded so the numbers survive a JSON round trip and compare equal in tests.
    return {"diem": round(diem, 10), "usd": round(usd, 10)}


def count_words(text: str) -> int:
    return len(text.split())


def prompt_word_count(messages: list[object]) -> int:
    """Roughly the prompt tokens: the words in every text content, plain or multi-part."""
    words = 0
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            words += count_words(content)
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    words += count_words(part["text"])
    return words


def usage_payload(
    prompt_tokens: int, completion_tokens: int, *, with_cost: bool,
    cached_tokens: int | None = None,
) -> dict[str, object]:
    """OpenAI's usage object; Venice adds ``cost`` to it. ``cached_tokens`` (when a test
    asks for it) is reported as both providers do, in ``prompt_tokens_details``: at most
    the prompt, since cached tokens are part of it."""
    usage: dict[str, object] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    if cached_tokens is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": min(cached_tokens, prompt_tokens)}
    if with_cost:
        usage["cost"] = fake_cost(prompt_tokens, completion_tokens)
    return usage


@dataclass(frozen=True)
class ChatReply:
    """One chat completion's identity and size; builds its JSON answer or its stream chunks."""

    model: str
    chunk_count: int
    created: int
    id: str = field(default_factory=lambda: f"chatcmpl-{uuid.uuid4().hex}")
    choices: int = 1  # the request's ``n``: as the providers do, each choice is generated

    def completion(self, usage: dict[str, object]) -> dict[str, object]:
        return {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": [
                {
                    "index": index,
                    "message": {"role": "assistant", "content": fake_reply_text(self.chunk_count)},
                    "logprobs": None,
                    "finish_reason": "stop",
                }
                for index in range(self.choices)
            ],
            "usage": usage,
        }

    def chunk(self, delta: dict[str, object], finish_reason: str | None,
              index: int = 0) -> dict[str, object]:
        choice = {"index": index, "delta": delta, "logprobs": None,
                  "finish_reason": finish_reason}
        return {**self._chunk_head(), "choices": [choice]}

    def usage_chunk(self, usage: dict[str, object]) -> dict[str, object]:
        """The usage-only chunk that ends a stream: no choices, just the usage."""
        return {**self._chunk_head(), "choices": [], "usage": usage}

    def _chunk_head(self) -> dict[str, object]:
        return {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
        }


# What a reply "thinks" (Anthropic's thinking blocks, OpenAI's reasoning summaries) before it
# answers: eight words, so eight output tokens, like a reply chunk.
FAKE_THINKING_TEXT = "The fake model thinks this request over first."
THINKING_TOKENS = 8
# The output tokens a tool call costs, whatever its arguments: one chunk's worth.
TOOL_CALL_TOKENS = WORDS_PER_CHUNK
# The request header that makes a reply call the named tool of the request (an Anthropic
# tool_use block, a Responses function_call or custom_tool_call).
TOOL_CALL_HEADER = "x-fake-tool-call"
# A custom (free-form) tool's input, as OpenAI's custom tools take plain text.
FAKE_CUSTOM_TOOL_INPUT = "fake input for the tool"

_ID_ALPHABET = "0123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"


def fake_id(prefix: str, length: int = 22) -> str:
    """A random id in Anthropic's style (``msg_01…``, ``toolu_01…``, ``req_011…``)."""
    alphabet_size = len(_ID_ALPHABET)
    raw = secrets.token_bytes(length)
    return prefix + "".join(_ID_ALPHABET[byte % alphabet_size] for byte in raw)


def openai_id(prefix: str) -> str:
    """A random id in OpenAI's style (``resp_…``, ``msg_…``): a prefix and 48 hex digits."""
    return prefix + secrets.token_hex(24)


def fake_signature(*parts: str) -> str:
    """An opaque, deterministic stand-in for a thinking signature or encrypted content."""
    digest = hashlib.sha256("\0".join(parts).encode()).digest()
    return base64.b64encode(digest * 2).decode("ascii")


def fake_tool_arguments(schema: object) -> dict[str, object]:
    """Arguments for a tool call that fit its JSON schema: a placeholder for each required
    property (every property when none is required), by type, in the schema's order."""
    if not isinstance(schema, dict) or not isinstance(schema.get("properties"), dict):
        return {}
    properties: dict[str, object] = schema["properties"]
    required = schema.get("required")
    names = [name for name in properties if not isinstance(required, list) or name in required]
    placeholders: dict[str, object] = {
        "string": "fake", "integer": 1, "number": 1, "boolean": True, "array": [], "object": {}}
    arguments: dict[str, object] = {}
    for name in names:
        spec = properties[name]
        kind = spec.get("type") if isinstance(spec, dict) else None
        if isinstance(spec, dict) and isinstance(spec.get("enum"), list) and spec["enum"]:
            arguments[name] = spec["enum"][0]
        else:
            arguments[name] = placeholders.get(kind if isinstance(kind, str) else "", "fake")
    return arguments


def fake_embedding(model: str, text: str, dimensions: int) -> list[float]:
    """A unit vector derived from the text, so equal inputs embed equally."""
    raw = hashlib.shake_256(f"{model}\0{text}".encode()).digest(4 * dimensions)
    components = [value / 2**31 - 1.0 for value in struct.unpack(f"<{dimensions}I", raw)]
    norm = sum(component * component for component in components) ** 0.5 or 1.0
    # Six decimals keep the float and the float32/base64 encodings of a vector comparable.
    return [round(component / norm, 6) for component in components]


def models_payload(wanted_type: str) -> dict[str, object]:
    """The catalogue; Venice filters it with ``?type=text|embedding``, "all" lists everything."""
    models = [
        {
            "id": model.id,
            "object": "model",
            "created": model.created,
            "owned_by": "venice.ai",
            "type": model.type,
            # Venice publishes each text model's price per million tokens in its list: the
            # rates the fake's usage.cost charges (prices sync reads them).
            **({"model_spec": {"pricing": {
                "input": {"usd": round(USD_PER_PROMPT_TOKEN * 1e6, 6),
                          "diem": round(DIEM_PER_PROMPT_TOKEN * 1e6, 6)},
                "output": {"usd": round(USD_PER_COMPLETION_TOKEN * 1e6, 6),
                           "diem": round(DIEM_PER_COMPLETION_TOKEN * 1e6, 6)},
            }}} if model.type == "text" else {}),
        }
        for model in FAKE_MODELS
        if wanted_type in ("all", model.type)
    ]
    return {"object": "list", "data": models}


def billing_payload() -> dict[str, object]:
    return {"object": "billing", "secret": BILLING_SECRET}
