"""`llm-gateway demo`: the gateway on embedded defaults in front of the bundled fake
upstream, with a key and the admin console; `demo --check`, the same for one JSON and one
streamed request, then stop (a self-test of an installed package)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

from llm_gateway.admin.service import CLI_ACTOR, AdminService
from llm_gateway.cli.common import settings_from, with_store
from llm_gateway.config import Secret, Settings
from llm_gateway.keys import KeyRecord
from llm_gateway.stores import Store

DEMO_MODEL = "llama-3.3-70b"
DEMO_DATABASE = "llm-gateway-demo.db"


def register(commands: Any) -> None:
    demo = commands.add_parser(
        "demo", help="run the gateway in front of the bundled fake upstream, with a dev key "
                     "and the admin console")
    demo.add_argument(
        "--check", action="store_true",
        help="a self-test instead: start, send one JSON and one streamed request through the "
             "fake upstream, check their usage records, stop (exit 0 when all held)")
    demo.set_defaults(handler=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    if args.check:
        return demo_check(settings)
    if "DATABASE_URL" not in os.environ:
        database = Path(DEMO_DATABASE).resolve()
        settings = dataclasses.replace(settings, database_url=f"sqlite:///{database}")
    return _run_demo(settings)


def _run_demo(settings: Settings) -> int:
    from llm_gateway.adapters.asgi import create_app
    from llm_gateway.adapters.server import bind_listeners, run_server
    from llm_gateway.admin.app import create_admin_app
    from llm_gateway.testing.fake_upstream import FakeUpstream, running_fake_upstream
    from llm_gateway.wiring import build_gateway

    # The ports first: a second demo must fail before it makes a key or prints a banner.
    side = [settings.admin_bind] if settings.admin_bind else []
    try:
        listeners = bind_listeners(settings.bind, side)
    except OSError as exc:
        print(f"llm-gateway demo: cannot listen on {settings.bind}: {exc.strerror} (is another "
              "demo running? BIND_ADDR=127.0.0.1:PORT picks another port)", file=sys.stderr)
        return 1
    fake = FakeUpstream(chunk_delay=0.05, record=False)
    with running_fake_upstream(fake) as (_, base_url):
        settings = dataclasses.replace(
            settings, venice_base_url=base_url, venice_api_key=Secret(fake.api_key))
        record, key, admin_token = asyncio.run(
            with_store(settings, partial(_demo_credentials, settings)))
        gateway = build_gateway(settings)
        admin = [(create_admin_app(gateway), bind) for bind in listeners.side]
        console = (f"http://{next(iter(listeners.side))}/admin/" if listeners.side else None)
        print(demo_banner(settings, base_url, record, key, console, admin_token), flush=True)
        run_server(create_app(settings, gateway=gateway), settings, also=admin,
                   listeners=listeners)
    return 0


async def _demo_credentials(settings: Settings, store: Store) -> tuple[KeyRecord, str, str]:
    service = AdminService(store, actor=CLI_ACTOR, settings=settings)  # type: ignore[arg-type]
    record, key = await service.create_key(name="demo", subject_id="demo-user")
    _, admin_token = await service.create_admin_token("demo console")
    return record, key, admin_token


def command_line() -> str:
    """How to run this command again from a shell: by name when PATH finds this very
    script, else by its full path (a venv's bin is rarely on PATH)."""
    script = Path(sys.argv[0]).resolve()
    found = shutil.which("llm-gateway")
    return "llm-gateway" if found and Path(found).resolve() == script else str(script)


def demo_banner(settings: Settings, upstream_url: str, record: KeyRecord, key: str,
                console: str | None, admin_token: str) -> str:
    gateway_url = f"http://{settings.bind_host}:{settings.bind_port}"
    body = json.dumps({"model": DEMO_MODEL, "messages": [{"role": "user", "content": "Hello!"}]})
    keys_list = f"DATABASE_URL={settings.database_url} {command_line()} keys list"
    console_lines = (f"  admin console:  {console}  (sign in with the admin token below)\n"
                     f"  admin token:    {admin_token}\n" if console else
                     "  admin console:  not started (its address is taken; ADMIN_BIND_ADDR)\n")
    return f"""
llm-gateway demo: a gateway on embedded defaults in front of the bundled fake upstream.
  gateway:        {gateway_url}   (health: {gateway_url}/healthz)
  fake upstream:  {upstream_url}  (stands in for Venice; no provider key needed)
{console_lines}  gateway key:    {record.prefix}…  (created for this demo; shown in full below)
  its keys:       {keys_list}

Call it with curl:

curl -s {gateway_url}/v1/chat/completions \\
  -H "Authorization: Bearer {key}" \\
  -H "Content-Type: application/json" \\
  -d '{body}'

Or with the openai SDK:

{sys.executable} - <<'PY'
from openai import OpenAI
client = OpenAI(base_url="{gateway_url}/v1", api_key="{key}")
reply = client.chat.completions.create(
    model="{DEMO_MODEL}", messages=[{{"role": "user", "content": "Hello!"}}]
)
print(reply.choices[0].message.content)
PY

Ctrl-C stops the demo.
"""


# ---- demo --check ------------------------------------------------------------------------

def demo_check(settings: Settings) -> int:
    """Exit 0 when a gateway started from this installation answered a JSON and a streamed
    request through the fake upstream and recorded both; else 1, saying what failed."""
    from llm_gateway.testing.fake_upstream import FakeUpstream, running_fake_upstream

    with tempfile.TemporaryDirectory(prefix="llm-gateway-check-") as scratch:
        settings = dataclasses.replace(
            settings, database_url=f"sqlite:///{scratch}/check.db",
            usage_spool_dir=f"{scratch}/spool", admin_bind=None, access_log="off")
        logging.getLogger().setLevel(logging.WARNING)  # one line of verdict, not the servers'
        try:
            with running_fake_upstream(FakeUpstream(record=False)) as (fake, base_url):
                settings = dataclasses.replace(
                    settings, venice_base_url=base_url, venice_api_key=Secret(fake.api_key))
                _, key, _ = asyncio.run(with_store(settings, partial(_demo_credentials, settings)))
                facts = _check_requests(settings, key)
            records = asyncio.run(with_store(settings, lambda store: store.usage_records()))
        except CheckFailed as failure:
            print(f"llm-gateway demo --check: FAILED: {failure}", file=sys.stderr)
            return 1
    if [r.status for r in records] != [200, 200] or not all(r.total_tokens for r in records):
        print("llm-gateway demo --check: FAILED: usage records "
              f"{[(r.status, r.total_tokens) for r in records]}, want two with tokens",
              file=sys.stderr)
        return 1
    print(f"llm-gateway demo --check: ok ({facts}; 2 usage records)")
    return 0


class CheckFailed(Exception):
    pass


def _check_requests(settings: Settings, key: str) -> str:
    import httpx
    import uvicorn

    from llm_gateway.adapters.asgi import create_app
    from llm_gateway.adapters.server import bind_listeners, server_config
    from llm_gateway.config import HostPort

    listeners = bind_listeners(HostPort("127.0.0.1", 0))
    port = listeners.public.getsockname()[1]
    bind = HostPort("127.0.0.1", port)
    server = uvicorn.Server(server_config(create_app(settings), bind, settings))
    logging.getLogger("uvicorn.error").setLevel(logging.WARNING)  # set by the line above
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listeners.public]},
                              daemon=True)
    thread.start()
    try:
        _wait_started(server, thread)
        return _two_requests(httpx, f"http://{bind}/v1/chat/completions", key)
    finally:
        server.should_exit = True
        thread.join(30)
        listeners.close()


def _wait_started(server: Any, thread: threading.Thread, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise CheckFailed("the gateway did not start")
        time.sleep(0.01)


def _two_requests(httpx: Any, url: str, key: str) -> str:
    body = {"model": DEMO_MODEL, "messages": [{"role": "user", "content": "Hello!"}]}
    headers = {"authorization": f"Bearer {key}"}
    answer = httpx.post(url, json=body, headers=headers, timeout=30)
    if answer.status_code != 200 or not answer.json()["choices"][0]["message"]["content"]:
        raise CheckFailed(f"JSON request: {answer.status_code} {answer.text[:200]}")
    events = 0
    with httpx.stream("POST", url, json={**body, "stream": True}, headers=headers,
                      timeout=30) as stream:
        if stream.status_code != 200:
            raise CheckFailed(f"streamed request: {stream.status_code}")
        lines = [line for line in stream.iter_lines() if line.startswith("data: ")]
        events = len(lines)
    if not lines or lines[-1] != "data: [DONE]":
        raise CheckFailed(f"streamed request ended without [DONE] after {events} events")
    return f"JSON 200, stream 200 with {events} events"
