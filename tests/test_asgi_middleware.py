"""GatewayMiddleware around an app of one's own: gateway routes under the prefix, the
app keeps everything else (its lifespan included)."""

from __future__ import annotations

import httpx

from asgi_middleware import GatewayMiddleware
from llm_gateway.testing.fake_upstream import FakeUpstream
from llm_gateway.wiring import build_gateway
from tests.conftest import make_settings
from tests.support import create_key, serve_in_thread

CHAT = {"model": "llama-3.3-70b", "messages": [{"role": "user", "content": "Hello"}]}


def make_app(events: list[str]):  # type: ignore[no-untyped-def]
    async def app(scope, receive, send) -> None:  # type: ignore[no-untyped-def]
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                events.append(message["type"])
                kind = message["type"].rsplit(".", 1)[-1]
                await send({"type": f"lifespan.{kind}.complete"})
                if kind == "shutdown":
                    return
        body = f"app saw {scope['method']} {scope['path']}".encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": body})

    return app


def test_middleware_serves_the_prefix_and_passes_the_rest(  # type: ignore[no-untyped-def]
    tmp_path, fake_url, fake: FakeUpstream
) -> None:
    settings = make_settings(tmp_path, fake_url)
    _, key = create_key(settings.database_url)
    events: list[str] = []
    app = GatewayMiddleware(make_app(events), build_gateway(settings), prefix="/llm/v1")
    with serve_in_thread(app) as url:
        headers = {"authorization": f"Bearer {key}"}
        completion = httpx.post(url + "/llm/v1/chat/completions", json=CHAT, headers=headers)
        assert completion.status_code == 200 and completion.json()["choices"]
        # Streams pass through the middleware unbuffered, as in the standalone app.
        with httpx.stream("POST", url + "/llm/v1/chat/completions", headers=headers,
                          json={**CHAT, "stream": True}) as stream:
            assert stream.headers["content-type"].startswith("text/event-stream")
            assert b"".join(stream.iter_raw()).endswith(b"data: [DONE]\n\n")
        # The app keeps its own routes, also under /v1 and next to the prefix.
        assert httpx.get(url + "/v1/chat/completions").text == "app saw GET /v1/chat/completions"
        assert httpx.get(url + "/llm/v1/billing").text == "app saw GET /llm/v1/billing"
        assert httpx.get(url + "/").text == "app saw GET /"
        assert httpx.get(url + "/healthz").json() == {"status": "ok"}
    # The wrapped app's lifespan still runs, and the gateway started and stopped with it.
    assert events == ["lifespan.startup", "lifespan.shutdown"]
    assert len(fake.requests) == 2
