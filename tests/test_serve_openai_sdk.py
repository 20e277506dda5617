"""`llm-gateway serve` as a real process, called with the official openai SDK."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from llm_gateway.testing.fake_upstream import FakeUpstream, Fault
from tests.support import (
    BIN,
    assert_stream_not_buffered,
    closed_port,
    create_key,
    free_port,
    gateway_process,
    gateway_processes,
)

MESSAGES = [{"role": "user", "content": "Tell me a story"}]


@pytest.fixture(scope="module")
def served(fake_server: tuple[FakeUpstream, str], tmp_path_factory) -> Iterator[tuple[str, str]]:  # type: ignore[no-untyped-def]
    _, fake_url = fake_server
    database_url = f"sqlite:///{tmp_path_factory.mktemp('serve') / 'gateway.db'}"
    _, key = create_key(database_url, name="sdk", rate_limit_requests=1000)
    env = {"DATABASE_URL": database_url, "VENICE_API_KEY": "sk-fake-upstream",
           "VENICE_BASE_URL": fake_url}
    with gateway_process(env) as url:
        yield url, key


def upstream_saw_only_the_server_key(fake: FakeUpstream, gateway_key: str) -> None:
    assert fake.requests
    for seen in fake.requests:
        assert seen.headers["authorization"] == "Bearer sk-fake-upstream"
        assert gateway_key not in json.dumps(seen.headers)
        assert gateway_key.encode() not in seen.body


def test_sync_json_and_passthrough_fields(served, fake: FakeUpstream) -> None:
    url, key = served
    client = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0)
    completion = client.chat.completions.create(
        model="llama-3.3-70b", messages=MESSAGES, temperature=0.25,  # type: ignore[arg-type]
        extra_body={"venice_parameters": {"include_venice_system_prompt": False,
                                          "enable_web_search": "auto"}},
    )
    assert completion.choices[0].message.content
    assert completion.usage is not None and completion.usage.total_tokens > 0
    [seen] = fake.requests
    assert seen.json["temperature"] == 0.25
    assert seen.json["venice_parameters"] == {"include_venice_system_prompt": False,
                                              "enable_web_search": "auto"}
    # The gateway added nothing to the body (Venice refuses unknown top-level fields).
    assert set(seen.json) == {"model", "messages", "temperature", "venice_parameters"}
    upstream_saw_only_the_server_key(fake, key)
    # The SDK's request id is the gateway's (the usage record's), one value; the provider's
    # own comes under a name of its own.
    raw = client.chat.completions.with_raw_response.create(model="llama-3.3-70b",
                                                          messages=MESSAGES)  # type: ignore[arg-type]
    assert re.fullmatch(r"req_[0-9a-f]{24}", raw.request_id or "")
    assert raw.headers["x-llm-gateway-upstream-request-id"].startswith("req_fake")


def test_sync_stream(served, fake: FakeUpstream) -> None:
    url, key = served
    client = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0)
    stream = client.chat.completions.create(
        model="llama-3.3-70b", messages=MESSAGES, stream=True,  # type: ignore[arg-type]
        stream_options={"include_usage": True}, temperature=0.7,
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.startswith("This is chunk 0")
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    assert fake.requests[0].json["stream_options"] == {"include_usage": True}
    assert fake.requests[0].json["temperature"] == 0.7
    upstream_saw_only_the_server_key(fake, key)


async def test_async_json_and_stream(served, fake: FakeUpstream) -> None:
    url, key = served
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key=key, max_retries=0)
    completion = await client.chat.completions.create(
        model="qwen3-4b", messages=MESSAGES  # type: ignore[arg-type]
    )
    assert completion.model == "qwen3-4b" and completion.choices[0].message.content
    stream = await client.chat.completions.create(
        model="qwen3-4b", messages=MESSAGES, stream=True  # type: ignore[arg-type]
    )
    pieces = [c.choices[0].delta.content async for c in stream if c.choices]
    assert "".join(p or "" for p in pieces).startswith("This is chunk 0")
    upstream_saw_only_the_server_key(fake, key)
    await client.close()


def test_embeddings_and_models(served, fake: FakeUpstream) -> None:
    url, key = served
    client = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0)
    embedding = client.embeddings.create(model="text-embedding-bge-m3", input="hello world")
    assert len(embedding.data[0].embedding) > 0
    assert {m.id for m in client.models.list()} >= {"llama-3.3-70b", "qwen3-4b"}
    upstream_saw_only_the_server_key(fake, key)


def test_sdk_reads_gateway_and_upstream_errors(served, fake: FakeUpstream) -> None:
    url, _key = served
    bad = openai.OpenAI(base_url=url + "/v1", api_key="llmg_not-a-real-key", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as raised:
        bad.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    assert raised.value.code == "invalid_api_key"
    assert fake.requests == []


def test_stream_is_not_buffered(served, fake: FakeUpstream) -> None:
    """With 300 ms between upstream chunks, the client holds the first content chunk
    before the upstream has sent the second one."""
    url, key = served
    client = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0)
    assert_stream_not_buffered(client, fake)


def test_serve_without_provider_key_refuses_to_start(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "VENICE_API_KEY"}
    env["DATABASE_URL"] = f"sqlite:///{tmp_path / 'x.db'}"
    result = subprocess.run([str(BIN / "llm-gateway"), "serve"], env=env, capture_output=True,
                            text=True, timeout=30)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith("llm-gateway: VENICE_API_KEY:")


def test_serve_with_its_key_store_down_exits_with_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "VENICE_API_KEY": "sk-fake-upstream",
           "DATABASE_URL": f"postgresql://postgres@127.0.0.1:{closed_port()}/test",
           "BIND_ADDR": f"127.0.0.1:{free_port()}", "ADMIN_BIND_ADDR": "off"}
    result = subprocess.run([str(BIN / "llm-gateway"), "serve"], env=env, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 3  # uvicorn's "application startup failed"
    errors = [line for line in result.stderr.splitlines() if " ERROR " in line]
    assert "cannot start: the key store is unreachable" in errors[0], result.stderr
    assert "Traceback" not in result.stderr


def test_keys_never_reach_the_logs(fake_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A serve process's whole output, through successes and failures, holds no key."""

    fake, fake_url = fake_server
    fake.reset()
    database_url = f"sqlite:///{tmp_path / 'logs.db'}"
    _, key = create_key(database_url, rate_limit_requests=3)
    env = {"DATABASE_URL": database_url, "VENICE_API_KEY": "sk-fake-upstream",
           "VENICE_BASE_URL": fake_url, "VENICE_MAX_RETRIES": "0"}
    with gateway_processes(env, 1) as [gateway]:
        headers = {"authorization": f"Bearer {key}"}
        body = {"model": "llama-3.3-70b", "messages": MESSAGES}
        fake.push_fault(Fault(status=500, message="boom"))
        statuses = [
            httpx.post(gateway.url + "/v1/chat/completions", json=body, headers=headers).status_code
            for _ in range(4)
        ]
        # The last character changed, so the checksum fails: never the key itself (a key
        # ending in "x" made `key[:-1] + "x"` the valid key, 1 run in 62).
        wrong = key[:-1] + ("y" if key.endswith("x") else "x")
        statuses.append(httpx.post(gateway.url + "/v1/chat/completions", json=body,
                                   headers={"authorization": f"Bearer {wrong}"}).status_code)
        assert statuses == [500, 200, 200, 429, 401]
        gateway.process.terminate()
        gateway.process.wait(10)
        time.sleep(0.1)
    output = "".join(gateway.output)
    assert "Uvicorn running" in output or "Application startup complete" in output
    for secret in (key, key[12:], "sk-fake-upstream"):
        assert secret not in output
