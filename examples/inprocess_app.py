"""A FastAPI service that calls an LLM itself, governed in process by llm-gateway.

Each of the service's callers sends its gateway key (header ``x-gateway-key``); every LLM
call the service makes while serving that caller is limited, metered and charged to it,
through the engine inside this process: no second hop, and the provider key never
enters the service's code. Run it against the bundled fake upstream::

    llm-gateway fake-upstream --listen 127.0.0.1:8001 &
    export VENICE_API_KEY=sk-fake-upstream VENICE_BASE_URL=http://127.0.0.1:8001/api/v1
    KEY=$(llm-gateway keys create --name alice | tail -n 1)
    uvicorn --factory examples.inprocess_app:create_app --port 8000
    curl -H "x-gateway-key: $KEY" 'http://127.0.0.1:8000/ask?q=Hello'
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import openai
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

import llm_gateway
from asgi_middleware import GatewayMiddleware

MODEL = "llama-3.3-70b"


def create_app() -> GatewayMiddleware:
    api = FastAPI()
    # One client of each kind for the whole service: whom a call is charged to comes from
    # the request being served, not from the client.
    client = llm_gateway.openai_client()
    async_client = llm_gateway.async_openai_client()

    def messages(q: str) -> list[dict[str, str]]:
        return [{"role": "user", "content": q}]

    @api.get("/ask")
    def ask(q: str) -> dict[str, str | None]:
        # A plain `def` endpoint: FastAPI runs it in a worker thread; the sync client
        # hands the call to the engine's event loop and waits.
        completion = client.chat.completions.create(model=MODEL, messages=messages(q))
        return {"answer": completion.choices[0].message.content}

    @api.get("/ask-async")
    async def ask_async(q: str) -> dict[str, str | None]:
        completion = await async_client.chat.completions.create(model=MODEL,
                                                                messages=messages(q))
        return {"answer": completion.choices[0].message.content}

    @api.get("/story")
    async def story(q: str) -> StreamingResponse:
        stream = await async_client.chat.completions.create(
            model=MODEL, messages=messages(q), stream=True)

        async def words() -> AsyncIterator[str]:
            async for chunk in stream:  # each chunk as the provider sends it
                if chunk.choices and chunk.choices[0].delta.content:
                    yield chunk.choices[0].delta.content

        return StreamingResponse(words(), media_type="text/plain")

    @api.get("/me/{user}/ask")
    async def ask_as_user(user: str, q: str) -> dict[str, str | None]:
        # Callers without gateway keys: the service's own login says who the user is (a
        # path parameter stands in for it here), and that subject is charged.
        with llm_gateway.acting_as(subject=user):
            completion = await async_client.chat.completions.create(model=MODEL,
                                                                    messages=messages(q))
        return {"answer": completion.choices[0].message.content}

    @api.exception_handler(openai.APIStatusError)
    async def gateway_said_no(request: Request, exc: openai.APIStatusError) -> JSONResponse:
        # The gateway's answers arrive as the SDK's exceptions: a 429 is RateLimitError.
        return JSONResponse({"error": exc.message}, exc.status_code)

    @api.exception_handler(llm_gateway.GatewayError)
    async def nobody_to_charge(request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse({"error": "send your gateway key in x-gateway-key"}, 401)

    # The gateway's routes (/v1/..., /healthz, /readyz, /metrics) beside the service's,
    # and each request's x-gateway-key bound for the service's own LLM calls.
    return GatewayMiddleware(api, govern_outbound=True, identity_header="x-gateway-key")
