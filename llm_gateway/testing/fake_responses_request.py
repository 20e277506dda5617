"""What the fake Responses API reads from a request, and the 400s it refuses one with, in
OpenAI's words: the top-level fields each endpoint takes, ``input`` as items, the conversation
``previous_response_id`` continues (looked up in the caller's store), the conversation's input
tokens, and what the headers and ``tool_choice`` steer (stream shape, cached tokens, the tool
the reply calls). A :class:`CreateRequest` is a ``POST /responses`` that passed every check."""

from dataclasses import dataclass

from llm_gateway.testing.fake_agent_reply import tool_to_call
from llm_gateway.testing.fake_content import count_words, prompt_word_count
from llm_gateway.testing.fake_endpoints import cached_tokens_asked
from llm_gateway.testing.fake_exchange import Exchange
from llm_gateway.testing.fake_responses_store import ResponseStore
from llm_gateway.testing.fake_stream import stream_settings

# The top-level fields of POST /responses: the openai SDK's (3.60), and Codex CLI's
# client_metadata (agents-wire.md), which OpenAI's own client sends to api.openai.com.
RESPONSES_FIELDS = frozenset({
    "model", "input", "instructions", "stream", "stream_options", "store", "background",
    "background_options", "previous_response_id", "conversation", "include", "max_output_tokens",
    "max_tool_calls", "metadata", "parallel_tool_calls", "prompt", "prompt_cache_key",
    "prompt_cache_options", "prompt_cache_retention", "reasoning", "safety_identifier",
    "service_tier", "temperature", "text", "tool_choice", "tools", "top_logprobs", "top_p",
    "truncation", "user", "access_programs", "context_management", "image", "moderation",
    "client_metadata",
})
INPUT_TOKENS_FIELDS = frozenset({
    "model", "input", "instructions", "conversation", "parallel_tool_calls", "personality",
    "previous_response_id", "reasoning", "text", "tool_choice", "tools", "truncation",
})
COMPACT_FIELDS = frozenset({
    "model", "input", "instructions", "previous_response_id", "prompt_cache_key",
    "prompt_cache_options", "prompt_cache_retention", "safety_identifier", "service_tier",
    "image",
})
MIN_MAX_OUTPUT_TOKENS = 16


@dataclass(frozen=True)
class Problem:
    """A 400 of OpenAI's: its message, and the ``param`` and ``code`` it names."""

    message: str
    param: str | None = None
    code: str | None = None

    async def send(self, exchange: Exchange) -> None:
        await exchange.send_error(400, self.message, param=self.param, code=self.code)


MISSING_MODEL = Problem("Missing required parameter: 'model'.", "model",
                        "missing_required_parameter")
_INVALID_INPUT = Problem("Invalid type for 'input': expected one of a string or array of input "
                         "items.", "input", "invalid_type")


async def request_object(exchange: Exchange, allowed: frozenset[str],
                         strict_fields: bool) -> dict[str, object] | None:
    """The request's JSON object, or None after OpenAI's 400 for a body that is none or (when
    ``strict_fields``) names a field the endpoint does not take: OpenAI names the first one."""
    request = exchange.body_json
    if not isinstance(request, dict):
        await exchange.send_error(
            400, "We could not parse the JSON body of your request. (HINT: This likely means "
            "you aren't using your HTTP library correctly. The OpenAI API expects a JSON "
            "payload, but what was sent was not valid JSON.)")
        return None
    unknown = next((name for name in request if name not in allowed), None) if strict_fields \
        else None
    if unknown is not None:
        await exchange.send_error(400, f"Unknown parameter: '{unknown}'.", param=unknown,
                                  code="unknown_parameter")
        return None
    return request


def normalised_input(raw: object) -> list[dict[str, object]] | None:
    """The request's ``input`` as items (a string is one user message), or None if invalid."""
    if raw is None:
        return []
    if isinstance(raw, str):
        return [{"type": "message", "role": "user",
                 "content": [{"type": "input_text", "text": raw}]}]
    if not isinstance(raw, list) or not all(isinstance(item, dict) for item in raw):
        return None
    items: list[dict[str, object]] = []
    for raw_item in raw:
        item = dict(raw_item)
        if "type" not in item and "role" in item:
            item["type"] = "message"
        items.append(item)
    return items


def _item_words(item: dict[str, object]) -> int:
    kind = item.get("type")
    if kind == "message":
        return prompt_word_count([item])
    if kind == "function_call":
        return count_words(str(item.get("arguments", "")))
    if kind == "custom_tool_call":
        return count_words(str(item.get("input", "")))
    if kind in ("function_call_output", "custom_tool_call_output"):
        output = item.get("output")
        if isinstance(output, str):
            return count_words(output)
        return prompt_word_count([{"content": output}]) if isinstance(output, list) else 0
    return 0


def conversation_tokens(request: dict[str, object],
                        conversation: list[dict[str, object]]) -> int:
    """The words of the request's own ``instructions`` and of every item of the conversation."""
    instructions = request.get("instructions")
    words = count_words(instructions) if isinstance(instructions, str) else 0
    return words + sum(_item_words(item) for item in conversation)


async def _previous_context(
    exchange: Exchange, store: ResponseStore, request: dict[str, object]
) -> list[dict[str, object]] | None:
    """The conversation ``previous_response_id`` continues ([] without one), or None after
    OpenAI's 400 for an id it does not know (never stored, deleted, or another key's)."""
    previous_id = request.get("previous_response_id")
    if previous_id is None:
        return []
    stored = store.get(exchange.api_key, previous_id) if isinstance(previous_id, str) else None
    if stored is None:
        await exchange.send_error(400, f"Previous response with id '{previous_id}' not found.",
                                  param="previous_response_id",
                                  code="previous_response_not_found")
        return None
    return list(stored.context)


async def counted_conversation(
    exchange: Exchange, store: ResponseStore, allowed: frozenset[str], strict_fields: bool
) -> tuple[dict[str, object], list[dict[str, object]]] | None:
    """(request, the whole conversation: previous turns and ``input``), or None after a 400."""
    request = await request_object(exchange, allowed, strict_fields)
    if request is None:
        return None
    items = normalised_input(request.get("input"))
    if items is None:
        await _INVALID_INPUT.send(exchange)
        return None
    context = await _previous_context(exchange, store, request)
    return None if context is None else (request, context + items)


def callable_tools(request: dict[str, object]) -> dict[str, str]:
    """The request's function and custom tools (name -> type): the ones the fake can call."""
    tools = request.get("tools")
    return {
        str(tool["name"]): str(tool["type"])
        for tool in (tools if isinstance(tools, list) else [])
        if isinstance(tool, dict) and tool.get("type") in ("function", "custom")
        and isinstance(tool.get("name"), str)
    }


def _tool_to_call(request: dict[str, object], headers: dict[str, str],
                  items: list[dict[str, object]]) -> str | ValueError | None:
    choice = request.get("tool_choice")
    named = choice.get("name") if isinstance(choice, dict) and choice.get("type") in (
        "function", "custom") else None
    answering = bool(items) and items[-1].get("type") in (
        "function_call_output", "custom_tool_call_output")
    return tool_to_call(callable_tools(request), headers, forbidden=choice == "none",
                        named=named, forced=choice == "required", answering=answering,
                        kinds="function or custom tool")


@dataclass(frozen=True)
class CreateRequest:
    """A ``POST /responses`` that passed every check, with what its headers steer."""

    body: dict[str, object]
    items: list[dict[str, object]]  # its input, as items
    context: list[dict[str, object]]  # the conversation before it (previous_response_id's)
    chunk_count: int
    chunk_delay: float
    cached_tokens: int | None
    tool_name: str | None

    @property
    def model(self) -> str:
        return str(self.body["model"])

    @property
    def storing(self) -> bool:
        return self.body.get("store") is not False  # store defaults to true

    @property
    def background(self) -> bool:
        return self.body.get("background") is True

    @property
    def streaming(self) -> bool:
        return self.body.get("stream") is True

    @property
    def conversation(self) -> list[dict[str, object]]:
        return self.context + self.items


def _create_problem(request: dict[str, object]) -> Problem | None:
    """What OpenAI refuses in a ``POST /responses`` before looking anything up, or None."""
    if not isinstance(request.get("model"), str):
        return MISSING_MODEL
    if normalised_input(request.get("input")) is None:
        return _INVALID_INPUT
    cap = request.get("max_output_tokens")
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int)
                            or cap < MIN_MAX_OUTPUT_TOKENS):
        return Problem("Invalid 'max_output_tokens': integer below minimum value. Expected a "
                       f"value >= {MIN_MAX_OUTPUT_TOKENS}, but got {cap} instead.",
                       "max_output_tokens", "integer_below_min_value")
    if request.get("background") is True and request.get("store") is False:
        return Problem("Background mode requires store=true.", "background")
    return None


def _steering(
    headers: dict[str, str], request: dict[str, object], items: list[dict[str, object]],
    chunk_count: int, chunk_delay: float,
) -> tuple[int, float, int | None, str | None] | str:
    """(chunk count, chunk delay, cached tokens, tool to call) as the headers and
    ``tool_choice`` steer the reply, or the problem with the first header found wrong."""
    settings = stream_settings(headers, chunk_count, chunk_delay)
    cached = cached_tokens_asked(headers)
    tool_name = _tool_to_call(request, headers, items)
    if isinstance(settings, str) or isinstance(cached, str) or isinstance(tool_name, ValueError):
        problem = settings if isinstance(settings, str) else (
            cached if isinstance(cached, str) else tool_name)
        return str(problem)
    return *settings, cached, tool_name


async def checked_create(
    exchange: Exchange, store: ResponseStore, *, chunk_count: int, chunk_delay: float,
    strict_fields: bool,
) -> CreateRequest | None:
    """The ``POST /responses`` to answer, or None after OpenAI's 400 for it."""
    request = await request_object(exchange, RESPONSES_FIELDS, strict_fields)
    if request is None:
        return None
    if (problem := _create_problem(request)) is not None:
        await problem.send(exchange)
        return None
    items = normalised_input(request.get("input"))
    assert items is not None  # _create_problem made sure
    context = await _previous_context(exchange, store, request)
    if context is None:
        return None
    steering = _steering(exchange.headers, request, items, chunk_count, chunk_delay)
    if isinstance(steering, str):
        await exchange.send_error(400, steering)
        return None
    return CreateRequest(request, items, context, *steering)
