"""What the fake Messages API reads from a request, and how it refuses one in Anthropic's words:
the API versions and top-level fields it takes (per version), the fields a request needs, the
prompt's tokens and how the cache headers divide them (:class:`CacheSplit`), the thinking asked
for, and what the headers and ``tool_choice`` steer (stream shape, cache split, the tool the reply
calls)."""

import json
from dataclasses import dataclass

from llm_gateway.testing.fake_agent_reply import tool_to_call
from llm_gateway.testing.fake_content import count_words
from llm_gateway.testing.fake_exchange import Exchange
from llm_gateway.testing.fake_stream import stream_settings

API_VERSIONS = ("2023-06-01", "2026-10-21")
# Anthropic's limit for a Messages request body (platform.claude.com/docs/en/api/overview).
MAX_REQUEST_BYTES = 32 * 1024 * 1024

# A Messages request's top-level fields: the anthropic SDK's (2.16, API version 2026-10-21)
# and its beta ones (what Claude Code sends with anthropic-beta), never rejected here.
MESSAGES_FIELDS = frozenset({
    "model", "messages", "max_tokens", "stream", "system", "metadata", "stop_sequences",
    "thinking", "tool_choice", "tools", "cache_control", "container", "diagnostics",
    "inference_geo", "output_config", "service_tier", "speed",
    # beta (client.beta.messages): Claude Code's context_management among them
    "context_management", "mcp_servers", "compaction", "billing_policy", "fallbacks",
    "fallback_credit_token", "thread",
})
# Removed in API version 2026-10-21; 2023-06-01 still takes them.
SAMPLING_FIELDS = frozenset({"temperature", "top_p", "top_k"})
COUNT_TOKENS_FIELDS = frozenset({
    "model", "messages", "system", "thinking", "tool_choice", "tools", "cache_control",
    "output_config", "speed", "context_management", "mcp_servers",
})

CACHE_READ_HEADER = "x-fake-cache-read-tokens"
CACHE_WRITE_HEADER = "x-fake-cache-write-tokens"
CACHE_WRITE_1H_HEADER = "x-fake-cache-write-1h-tokens"


def version_problem(headers: dict[str, str]) -> str | None:
    """Why the request's ``anthropic-version`` is refused (Anthropic's words), or None."""
    version = headers.get("anthropic-version")
    if version is None:
        return "anthropic-version: header is required"
    if version not in API_VERSIONS:
        return f'anthropic-version: "{version}" is not a valid version'
    return None


def _content_words(content: object) -> int:
    if isinstance(content, str):
        return count_words(content)
    if not isinstance(content, list):
        return 0
    words = 0
    for block in content:
        if not isinstance(block, dict):
            continue
        if isinstance(block.get("text"), str):
            words += count_words(block["text"])
        elif block.get("type") == "tool_result":
            words += _content_words(block.get("content"))
        elif block.get("type") == "tool_use":
            words += count_words(json.dumps(block.get("input", {})))
    return words


def prompt_tokens(request: dict[str, object]) -> int:
    """The request's input tokens: the words of its system prompt and of its messages."""
    words = _content_words(request.get("system"))
    messages = request.get("messages")
    for message in messages if isinstance(messages, list) else []:
        if isinstance(message, dict):
            words += _content_words(message.get("content"))
    return words


@dataclass(frozen=True)
class CacheSplit:
    """How the prompt's tokens divide between fresh input and the prompt cache."""

    prompt: int
    read: int = 0
    write_5m: int = 0
    write_1h: int = 0

    @property
    def input(self) -> int:
        return self.prompt - self.read - self.write_5m - self.write_1h

    def usage(self, output_tokens: int) -> dict[str, object]:
        return {
            "input_tokens": self.input,
            "cache_creation_input_tokens": self.write_5m + self.write_1h,
            "cache_read_input_tokens": self.read,
            "cache_creation": {"ephemeral_5m_input_tokens": self.write_5m,
                               "ephemeral_1h_input_tokens": self.write_1h},
            "output_tokens": output_tokens,
            "service_tier": "standard",
        }


def _cache_split(headers: dict[str, str], prompt: int) -> CacheSplit | str:
    """The split the cache headers ask for, never more than the prompt, or a problem."""
    asked: list[int] = []
    for name in (CACHE_READ_HEADER, CACHE_WRITE_HEADER, CACHE_WRITE_1H_HEADER):
        raw = headers.get(name, "0")
        if not raw.isdigit():
            return f"{name} must be a non-negative integer"
        asked.append(int(raw))
    left = prompt
    taken: list[int] = []
    for tokens in asked:  # reads first, then 5-minute writes, then 1-hour writes
        taken.append(min(tokens, left))
        left -= taken[-1]
    return CacheSplit(prompt, *taken)


def client_tools(request: dict[str, object]) -> dict[str, dict[str, object]]:
    """The request's own tools (name -> definition); server tools are not the fake's to run."""
    tools = request.get("tools")
    return {
        tool["name"]: tool for tool in (tools if isinstance(tools, list) else [])
        if isinstance(tool, dict) and isinstance(tool.get("name"), str)
        and tool.get("type") in (None, "custom")
    }


def _answers_tool_result(request: dict[str, object]) -> bool:
    messages = request.get("messages")
    if not isinstance(messages, list) or not messages or not isinstance(messages[-1], dict):
        return False
    last = messages[-1]
    content = last.get("content")
    return last.get("role") == "user" and isinstance(content, list) and any(
        isinstance(block, dict) and block.get("type") == "tool_result" for block in content)


def _tool_to_call(request: dict[str, object],
                  headers: dict[str, str]) -> str | ValueError | None:
    choice = request.get("tool_choice")
    kind = choice.get("type") if isinstance(choice, dict) else None
    named = choice.get("name") if isinstance(choice, dict) and kind == "tool" else None
    return tool_to_call(client_tools(request), headers, forbidden=kind == "none", named=named,
                        forced=kind == "any", answering=_answers_tool_result(request))


def steering(
    headers: dict[str, str], request: dict[str, object], chunk_count: int, chunk_delay: float
) -> tuple[int, float, CacheSplit, str | None] | str:
    """(chunk count, chunk delay, cache split, tool to call) as the headers and
    ``tool_choice`` steer the reply, or the problem with the first header found wrong."""
    settings = stream_settings(headers, chunk_count, chunk_delay)
    if isinstance(settings, str):
        return settings
    cache = _cache_split(headers, prompt_tokens(request))
    tool_name = _tool_to_call(request, headers)
    if isinstance(cache, str) or isinstance(tool_name, ValueError):
        return str(cache if isinstance(cache, str) else tool_name)
    return *settings, cache, tool_name


def thinking(request: dict[str, object]) -> tuple[bool, bool]:
    """(thinks, its text is omitted)."""
    asked = request.get("thinking")
    if not isinstance(asked, dict) or asked.get("type") not in ("enabled", "adaptive"):
        return False, False
    return True, asked.get("display") == "omitted"


def _request_problem(request: dict[str, object], *, counting: bool) -> tuple[str, str] | None:
    """(field, problem) for a request the API refuses before generating anything."""
    if "model" not in request:
        return "model", "Field required"
    if not isinstance(request["model"], str):
        return "model", "Input should be a valid string"
    if not counting:
        max_tokens = request.get("max_tokens")
        if "max_tokens" not in request:
            return "max_tokens", "Field required"
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int):
            return "max_tokens", "Input should be a valid integer"
        if max_tokens < 0:
            return "max_tokens", "Input should be greater than or equal to 0"
    if "messages" not in request:
        return "messages", "Field required"
    if not isinstance(request["messages"], list):
        return "messages", "Input should be a valid list"
    if not request["messages"]:
        return "messages", "at least one message is required"
    return None


async def checked_request(
    exchange: Exchange, *, counting: bool, strict_fields: bool
) -> dict[str, object] | None:
    """The request to answer (``counting``: a count_tokens one), or None after Anthropic's 400:
    for a body that is no object, a field the version does not take, a field missing or
    mistyped."""
    request = exchange.body_json
    if not isinstance(request, dict):
        await exchange.send_error(400, "Request body must be a JSON object")
        return None
    allowed = COUNT_TOKENS_FIELDS if counting else MESSAGES_FIELDS
    if not counting and exchange.headers.get("anthropic-version") == "2023-06-01":
        allowed = allowed | SAMPLING_FIELDS
    unknown = next((name for name in request if name not in allowed), None) if strict_fields \
        else None
    if unknown is not None:
        await exchange.reject(unknown, "Extra inputs are not permitted")
        return None
    problem = _request_problem(request, counting=counting)
    if problem is not None:
        await exchange.reject(*problem)
        return None
    return request
