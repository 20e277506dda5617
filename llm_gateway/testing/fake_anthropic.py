"""Anthropic's Messages API as the fake upstream's ``anthropic`` mode speaks it (the API at
``https://api.anthropic.com/v1``; platform.claude.com/docs/en/api/messages, .../messages-streaming,
.../versioning, and the official ``anthropic`` SDK 2.16's types, which are what its clients parse).

What it answers, under the fake's prefix (``/v1`` by default in this mode):

* ``POST /messages`` -- a ``message`` (``msg_…``) whose content is, in order: a ``thinking`` block
  when the request enables thinking (``enabled`` or ``adaptive``; with ``display: "omitted"``
  its text is empty and only the signature comes), then either a ``tool_use`` block or a
  ``text`` block of :func:`fake_reply_text`. With ``"stream": true`` the real event sequence:
  ``message_start`` (usage with the input and cache tokens, ``output_tokens: 1``), per block
  ``content_block_start`` / ``content_block_delta`` (``thinking_delta`` + ``signature_delta``,
  ``text_delta`` per reply chunk, ``input_json_delta`` pieces) / ``content_block_stop``, a
  ``ping`` after the first block starts, ``message_delta`` (``stop_reason`` and the cumulative
  usage) and ``message_stop``, each framed ``event: <type>`` + ``data: <json>``.
* ``POST /messages/count_tokens`` -- ``{"input_tokens": N}``.
* ``GET /models`` (``limit``, ``after_id``, ``before_id``) and ``GET /models/{id}`` -- Anthropic's
  list shape over :data:`FAKE_CLAUDE_MODELS`, newest first.

Tokens, so tests can predict them: the prompt is the words of ``system`` and of every text in
``messages`` (text blocks, tool results' texts, and tool_use inputs as JSON); tools' definitions
are free. Each reply chunk costs :data:`WORDS_PER_CHUNK` output tokens, thinking
:data:`THINKING_TOKENS`, a tool call :data:`TOOL_CALL_TOKENS`. ``max_tokens`` is required and
honoured: what does not fit is left out and ``stop_reason`` is ``"max_tokens"``. As Anthropic
reports it, ``usage.input_tokens`` EXCLUDES cached tokens: input + cache reads + cache writes make
the prompt. Headers steer one request: ``x-fake-cache-read-tokens``,
``x-fake-cache-write-tokens`` (5-minute) and ``x-fake-cache-write-1h-tokens`` take that many of
the prompt's tokens (in that order, never more than the prompt) as read from or written to the
cache; ``x-fake-tool-call: <tool name>`` makes it call that tool of the request's ``tools``
(a ``tool_choice`` of ``tool`` or ``any`` forces a call as well, ``none`` forbids one). A turn
answering a ``tool_result`` answers with text unless ``tool_choice`` forces a call;
``x-fake-chunks`` and ``x-fake-chunk-delay-ms`` work as for chat completions.

Strict as the API: ``anthropic-version`` is required (a 400 "anthropic-version: header is
required"; an unknown one is a 400 too); a top-level field the API does not take is a 400
``"<field>: Extra inputs are not permitted"``. The fields are those of the SDK (2026-10-21)
plus the beta ones Claude Code sends (``context_management``, ``mcp_servers``, ...); version
2023-06-01 also takes ``temperature``, ``top_p`` and ``top_k``, which 2026-10-21 removed
("a request that sends any of them returns a 400").

This module holds the endpoints and the model catalogue; the parts live beside it:
``fake_anthropic_request`` (the checks and what a request steers) and ``fake_anthropic_reply``
(the planned answer, as a message or its event stream).
"""

import urllib.parse
from dataclasses import dataclass

from llm_gateway.testing.fake_anthropic_reply import plan_reply, stream
from llm_gateway.testing.fake_anthropic_request import checked_request, prompt_tokens, steering
from llm_gateway.testing.fake_exchange import Exchange
from llm_gateway.testing.fake_faults import Fault
from llm_gateway.testing.fake_stream import waited_as_generating


@dataclass(frozen=True)
class ClaudeModel:
    id: str
    display_name: str
    created_at: str  # RFC 3339, as the API writes it
    max_input_tokens: int
    max_tokens: int


FAKE_CLAUDE_MODELS: tuple[ClaudeModel, ...] = (  # newest first, as the API lists them
    ClaudeModel("claude-opus-5-5", "Claude Opus 5.5", "2026-09-24T00:00:00Z", 1_000_000, 128_000),
    ClaudeModel("claude-sonnet-5-5", "Claude Sonnet 5.5", "2026-09-24T00:00:00Z", 1_000_000,
                128_000),
    ClaudeModel("claude-haiku-5-5", "Claude Haiku 5.5", "2026-08-13T00:00:00Z", 200_000, 64_000),
    ClaudeModel("claude-sonnet-4-6", "Claude Sonnet 4.6", "2026-02-17T00:00:00Z", 1_000_000,
                64_000),
)


async def messages(
    exchange: Exchange, fault: Fault | None, *, chunk_count: int, chunk_delay: float,
    strict_fields: bool,
) -> None:
    request = await checked_request(exchange, counting=False, strict_fields=strict_fields)
    if request is None:
        return
    steered = steering(exchange.headers, request, chunk_count, chunk_delay)
    if isinstance(steered, str):
        await exchange.send_error(400, steered)
        return
    chunk_count, chunk_delay, cache, tool_name = steered
    max_tokens = request["max_tokens"]
    assert isinstance(max_tokens, int)  # checked_request made sure
    reply = plan_reply(request, str(request["model"]), max_tokens, chunk_count, tool_name, cache)
    if request.get("stream") is True:
        await stream(exchange, fault, reply, chunk_delay)
    elif await waited_as_generating(exchange, chunk_delay, reply.delta_count):
        await exchange.send_success(reply.message(), fault)


async def count_tokens(exchange: Exchange, fault: Fault | None, *, strict_fields: bool) -> None:
    request = await checked_request(exchange, counting=True, strict_fields=strict_fields)
    if request is not None:
        await exchange.send_success({"input_tokens": prompt_tokens(request)}, fault)


def _model_payload(model: ClaudeModel) -> dict[str, object]:
    return {
        "type": "model",
        "id": model.id,
        "display_name": model.display_name,
        "created_at": model.created_at,
        "max_input_tokens": model.max_input_tokens,
        "max_tokens": model.max_tokens,
        "lifecycle": "active",
        "deprecated_at": None,
        "retires_at": None,
    }


async def list_models(exchange: Exchange, fault: Fault | None) -> None:
    query = urllib.parse.parse_qs(exchange.query)
    raw_limit = query.get("limit", ["20"])[0]
    if not raw_limit.isdigit() or not 1 <= int(raw_limit) <= 1000:
        await exchange.reject("limit", "Input should be an integer from 1 to 1000")
        return
    models = list(FAKE_CLAUDE_MODELS)
    ids = [model.id for model in models]
    if "after_id" in query and query["after_id"][0] in ids:
        models = models[ids.index(query["after_id"][0]) + 1 :]
    elif "before_id" in query and query["before_id"][0] in ids:
        models = models[: ids.index(query["before_id"][0])]
    page = models[: int(raw_limit)]
    payload = {
        "data": [_model_payload(model) for model in page],
        "has_more": len(page) < len(models),
        "first_id": page[0].id if page else None,
        "last_id": page[-1].id if page else None,
    }
    await exchange.send_success(payload, fault)


async def get_model(exchange: Exchange, fault: Fault | None, model_id: str) -> None:
    model = next((model for model in FAKE_CLAUDE_MODELS if model.id == model_id), None)
    if model is None:
        await exchange.send_error(404, f"model: {model_id}")
        return
    await exchange.send_success(_model_payload(model), fault)
