"""A planned Responses reply as OpenAI streams it: the named events, each with a
``sequence_number`` counting from 0 -- ``response.created``, ``response.in_progress``, per item
``response.output_item.added``, its content events and ``response.output_item.done``, then
``response.completed`` (or ``response.incomplete``); no ``[DONE]``. A fault's in-band error
becomes the ``error`` and ``response.failed`` events, its other stream failures fall on the
content chunks (:class:`ChunkPacer`)."""

import itertools

from llm_gateway.testing.fake_exchange import Exchange
from llm_gateway.testing.fake_faults import Fault
from llm_gateway.testing.fake_responses_reply import Plan
from llm_gateway.testing.fake_stream import ChunkPacer


async def stream(exchange: Exchange, fault: Fault | None, plan: Plan, start: dict[str, object],
                 final: dict[str, object], chunk_delay: float) -> None:
    numbers = itertools.count()

    async def event(kind: str, payload: dict[str, object]) -> None:
        await exchange.send_event(kind, {"type": kind, **payload,
                                         "sequence_number": next(numbers)})

    await exchange.start_event_stream()
    await event("response.created", {"response": start})
    await event("response.in_progress", {"response": start})
    if fault is not None and fault.inband_error is not None:
        await event("error", {"code": "server_error", "message": fault.inband_error,
                              "param": None})
        await event("response.failed", {"response": final})
        await exchange.end_stream()
        return
    pacer = ChunkPacer(exchange, fault, plan.chunk_count, chunk_delay)
    for index, item in enumerate(plan.items):
        await event("response.output_item.added", {"output_index": index, "item": item.added})
        for kind, payload, chunk in item.events:
            if chunk and not await pacer.before_chunk():
                return
            await event(kind, payload)
            if chunk:
                pacer.chunk_sent()
        await event("response.output_item.done", {"output_index": index, "item": item.final})
    await pacer.finish()
    ending = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
    await event(ending, {"response": final})
    await exchange.end_stream()
