"""OpenAI's Responses API as the fake upstream's ``openai`` mode speaks it
(developers.openai.com/api/reference/resources/responses, and the official ``openai`` SDK 3.60's
types, which are what its clients parse). Venice mode does not serve it: see below.

What it answers, under the fake's prefix:

* ``POST /responses`` -- a ``response`` (``resp_…``) whose ``output`` is, in order: a
  ``reasoning`` item when the request sets ``reasoning`` (effort other than ``none``; its
  summary only when ``reasoning.summary`` asks for one, its ``encrypted_content`` only when
  ``include`` asks for ``reasoning.encrypted_content``), then a ``function_call`` (or
  ``custom_tool_call``) item or a ``message`` with one ``output_text`` of
  :func:`fake_reply_text`. With ``"stream": true`` the real named events, each with a
  ``sequence_number`` counting from 0: ``response.created``, ``response.in_progress``, per item
  ``response.output_item.added`` / its content events (``response.content_part.added``,
  ``response.output_text.delta`` per reply chunk, ``response.output_text.done``,
  ``response.content_part.done``; ``response.function_call_arguments.delta``/``.done``;
  ``response.custom_tool_call_input.delta``/``.done``; the ``reasoning_summary_*`` ones) /
  ``response.output_item.done``, then ``response.completed`` with the usage, or
  ``response.incomplete`` when ``max_output_tokens`` cut the reply. No ``[DONE]``.
* ``GET``/``DELETE /responses/{id}``, ``POST /responses/{id}/cancel``,
  ``GET /responses/{id}/input_items`` -- on stored responses. ``store`` defaults to true; the
  store is per API key (as OpenAI keeps projects apart), holds the newest
  :data:`MAX_STORED_RESPONSES`, and ``previous_response_id`` naming an unknown or deleted
  response is a 400 ``previous_response_not_found``. Only ``background`` responses can be
  cancelled (others: a 400 "Cannot cancel a synchronous response."); a background response is
  ``queued`` at first and done once its generation time (the chunk delay per piece) has passed.
* ``POST /responses/input_tokens`` -- ``{"object": "response.input_tokens", "input_tokens": N}``;
  ``POST /responses/compact`` -- a ``response.compaction``: the conversation's user messages
  followed by one ``compaction`` item (what Codex's remote compaction reads).

Tokens, so tests can predict them: the input is the words of ``instructions`` (never carried
over from a previous response, as OpenAI documents) and of every item of the conversation: the
chain of ``previous_response_id`` (inputs and outputs), then ``input`` (message texts, function
call arguments and outputs, custom tool inputs and outputs). Each reply chunk costs
:data:`WORDS_PER_CHUNK` output tokens, reasoning :data:`THINKING_TOKENS` (reported as
``output_tokens_details.reasoning_tokens``), a tool call :data:`TOOL_CALL_TOKENS`.
``max_output_tokens`` (at least 16, as OpenAI requires) is honoured: what does not fit is left
out and the response is ``incomplete`` (``incomplete_details.reason: "max_output_tokens"``).
Headers steer one request: ``x-fake-cached-tokens`` (``input_tokens_details.cached_tokens``),
``x-fake-tool-call: <tool name>`` (call that function or custom tool of ``tools``; a turn
answering a tool's output answers with text unless ``tool_choice`` forces a call, as
``"required"`` or a named tool does), ``x-fake-chunks``, ``x-fake-chunk-delay-ms``.

Strict as the API: a top-level field it does not take is a 400 ``unknown_parameter`` ("Unknown
parameter: 'max_tokens'.": the Responses API calls it ``max_output_tokens``). The fields are the
SDK's plus Codex CLI's ``client_metadata``.

Venice documents a beta ``POST /responses`` of its own (docs.venice.ai, guides/features/
responses-api: stateless, ``store`` always false, ``data: [DONE]`` at the end); the fake does not
imitate it, so in venice mode these paths are unimplemented like any other.

This module holds the endpoints; the parts live beside it: ``fake_responses_request`` (the
checks and what a request steers), ``fake_responses_reply`` (the planned output and the response
object), ``fake_responses_stream`` (its events) and ``fake_responses_store``.
"""

import json
import time
import urllib.parse

from llm_gateway.testing.fake_content import WORDS_PER_CHUNK, fake_signature, openai_id
from llm_gateway.testing.fake_exchange import Exchange, send_json
from llm_gateway.testing.fake_faults import Fault
from llm_gateway.testing.fake_responses_reply import (
    Plan,
    finished,
    plan_output,
    response_object,
    usage,
)
from llm_gateway.testing.fake_responses_request import (
    COMPACT_FIELDS,
    INPUT_TOKENS_FIELDS,
    MISSING_MODEL,
    CreateRequest,
    checked_create,
    conversation_tokens,
    counted_conversation,
)
from llm_gateway.testing.fake_responses_store import (
    ResponseStore,
    StoredResponse,
    listed_item,
)
from llm_gateway.testing.fake_responses_stream import stream
from llm_gateway.testing.fake_stream import waited_as_generating

COMPACTION_TOKENS = WORDS_PER_CHUNK  # the output tokens a compaction costs


async def create(
    exchange: Exchange, fault: Fault | None, store: ResponseStore, *, chunk_count: int,
    chunk_delay: float, strict_fields: bool,
) -> None:
    asked = await checked_create(exchange, store, chunk_count=chunk_count,
                                 chunk_delay=chunk_delay, strict_fields=strict_fields)
    if asked is None:
        return
    plan = plan_output(asked.body, asked.model, asked.chunk_count, asked.tool_name)
    start = response_object(asked.body, openai_id("resp_"), int(time.time()), asked.storing)
    failure = fault.inband_error if fault is not None else None
    used = usage(conversation_tokens(asked.body, asked.conversation), asked.cached_tokens,
                 plan.fitted.output_tokens, plan.fitted.thinking_tokens)
    final = finished(start, plan, used, failure)
    if asked.storing:
        _keep(exchange, store, asked, plan, final, failed=failure is not None)
    if asked.streaming:
        await stream(exchange, fault, plan, start, final, asked.chunk_delay)
    elif asked.background:
        await exchange.send_success({**start, "status": "queued"}, fault)
    elif not await waited_as_generating(exchange, asked.chunk_delay, plan.chunk_count):
        return
    elif failure is not None:
        await send_json(exchange.send, 200, final)  # a failed response, as OpenAI answers one
    else:
        await exchange.send_success(final, fault)


def _keep(exchange: Exchange, store: ResponseStore, asked: CreateRequest, plan: Plan,
           final: dict[str, object], *, failed: bool) -> None:
    """Keep the response for retrieval and for the turns that continue it; a background one
    is done once its generation time (the chunk delay per piece) has passed."""
    output = [] if failed else [item.final for item in plan.items]
    generation_time = asked.chunk_delay * plan.chunk_count
    store.put(exchange.api_key, StoredResponse(
        final, [listed_item(item) for item in asked.items], asked.conversation + output,
        asked.background, time.monotonic() + generation_time))


async def _stored(exchange: Exchange, store: ResponseStore,
                  response_id: str) -> StoredResponse | None:
    stored = store.get(exchange.api_key, response_id)
    if stored is None:
        await exchange.send_error(404, f"Response with id '{response_id}' not found.")
    return stored

async def retrieve(exchange: Exchange, fault: Fault | None, store: ResponseStore,
                   response_id: str) -> None:
    stored = await _stored(exchange, store, response_id)
    if stored is not None:
        await exchange.send_success(stored.current(), fault)


async def delete(exchange: Exchange, fault: Fault | None, store: ResponseStore,
                 response_id: str) -> None:
    if await _stored(exchange, store, response_id) is not None:
        store.delete(exchange.api_key, response_id)
        payload = {"id": response_id, "object": "response.deleted", "deleted": True}
        await exchange.send_success(payload, fault)


async def cancel(exchange: Exchange, fault: Fault | None, store: ResponseStore,
                 response_id: str) -> None:
    stored = await _stored(exchange, store, response_id)
    if stored is None:
        return
    if not stored.background:
        await exchange.send_error(400, "Cannot cancel a synchronous response.")
        return
    if stored.current()["status"] in ("queued", "in_progress"):
        stored.cancelled = True
    # A background response already done stays as it was: cancelling it again is no error.
    await exchange.send_success(stored.current(), fault)


async def input_items(exchange: Exchange, fault: Fault | None, store: ResponseStore,
                      response_id: str) -> None:
    stored = await _stored(exchange, store, response_id)
    if stored is None:
        return
    query = urllib.parse.parse_qs(exchange.query)
    order = query.get("order", ["desc"])[0]
    raw_limit = query.get("limit", ["20"])[0]
    if order not in ("asc", "desc") or not raw_limit.isdigit() or not 1 <= int(raw_limit) <= 100:
        await exchange.send_error(400, "Invalid 'order' or 'limit': order is asc or desc, limit "
                                  "an integer from 1 to 100.")
        return
    items = stored.input_items if order == "asc" else stored.input_items[::-1]
    ids = [item["id"] for item in items]
    after = query.get("after", [None])[0]
    if after in ids:
        items = items[ids.index(after) + 1 :]
    page = items[: int(raw_limit)]
    payload = {"object": "list", "data": page,
               "first_id": page[0]["id"] if page else None,
               "last_id": page[-1]["id"] if page else None,
               "has_more": len(page) < len(items)}
    await exchange.send_success(payload, fault)


async def input_tokens(exchange: Exchange, fault: Fault | None, store: ResponseStore, *,
                       strict_fields: bool) -> None:
    counted = await counted_conversation(exchange, store, INPUT_TOKENS_FIELDS, strict_fields)
    if counted is not None:
        tokens = conversation_tokens(*counted)
        await exchange.send_success({"object": "response.input_tokens", "input_tokens": tokens},
                                    fault)


async def compact(exchange: Exchange, fault: Fault | None, store: ResponseStore, *,
                  strict_fields: bool) -> None:
    counted = await counted_conversation(exchange, store, COMPACT_FIELDS, strict_fields)
    if counted is None:
        return
    request, conversation = counted
    if not isinstance(request.get("model"), str):
        await MISSING_MODEL.send(exchange)
        return
    kept = [listed_item(item) for item in conversation
            if item.get("type") == "message" and item.get("role") == "user"]
    compaction = {"id": openai_id("cmp_"), "type": "compaction",
                  "encrypted_content": fake_signature(str(request["model"]), json.dumps(kept))}
    payload = {
        "id": openai_id("resp_"),
        "object": "response.compaction",
        "created_at": int(time.time()),
        "output": [*kept, compaction],
        "usage": usage(conversation_tokens(request, conversation), None, COMPACTION_TOKENS, 0),
    }
    await exchange.send_success(payload, fault)
