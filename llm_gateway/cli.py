"""The `llm-gateway` command: serve, demo, migrate, keys, and the other adapters."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import sys
import time
from collections.abc import Sequence

from llm_gateway.config import ConfigError, Secret, Settings, host_port_argument, load_settings
from llm_gateway.keys import (
    DEFAULT_RATE_LIMIT,
    KeyRecord,
    new_key_record,
    parse_duration,
    parse_rate_limit,
)
from llm_gateway.stores import Store, open_store

EXIT_CONFIG = 2


def _settings(args: argparse.Namespace) -> Settings:
    return load_settings(os.environ, getattr(args, "config", None))


def _run_server(app: object, settings: Settings) -> None:
    import uvicorn

    # No access log: per-request logging costs CPU on the hot path, and usage records
    # already hold what an access log would (without prompts or keys).
    uvicorn.run(
        app,  # type: ignore[arg-type]
        host=settings.bind_host,
        port=settings.bind_port,
        access_log=False,
        # Nothing reads the client address, and no uvicorn banner goes to clients.
        proxy_headers=False,
        server_header=False,
        lifespan="on",
        log_level="info",
        timeout_graceful_shutdown=10,
    )


# ---- serve / demo / migrate -----------------------------------------------------------

def cmd_serve(args: argparse.Namespace) -> int:
    from llm_gateway.adapters.asgi import create_app

    settings = _settings(args)
    settings.require_provider_key()
    _run_server(create_app(settings), settings)
    return 0


DEMO_MODEL = "llama-3.3-70b"


def cmd_demo(args: argparse.Namespace) -> int:
    from llm_gateway.adapters.asgi import create_app
    from llm_gateway.testing.fake_upstream import FakeUpstream, running_fake_upstream

    settings = _settings(args)
    if "DATABASE_URL" not in os.environ:
        settings = dataclasses.replace(settings, database_url="sqlite:///./llm-gateway-demo.db")
    fake = FakeUpstream(chunk_delay=0.05, record=False)
    with running_fake_upstream(fake) as (_, base_url):
        settings = dataclasses.replace(
            settings, venice_base_url=base_url, venice_api_key=Secret(fake.api_key)
        )
        record, key = asyncio.run(_create_key(settings, name="demo", subject_id="demo-user"))
        gateway_url = f"http://{settings.bind_host}:{settings.bind_port}"
        print(_demo_banner(gateway_url, base_url, record, key), flush=True)
        _run_server(create_app(settings), settings)
    return 0


def _demo_banner(gateway_url: str, upstream_url: str, record: KeyRecord, key: str) -> str:
    body = json.dumps({"model": DEMO_MODEL, "messages": [{"role": "user", "content": "Hello!"}]})
    return f"""
llm-gateway demo: a gateway on embedded defaults in front of the bundled fake upstream.
  gateway:        {gateway_url}   (health: {gateway_url}/healthz)
  fake upstream:  {upstream_url}  (stands in for Venice; no provider key needed)
  gateway key:    {record.prefix}…  (created for this demo; `llm-gateway keys list` shows it)

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


def cmd_migrate(args: argparse.Namespace) -> int:
    async def run() -> list[int]:
        store = open_store(_settings(args).database_url)
        try:
            return await store.migrate()
        finally:
            await store.close()

    applied = asyncio.run(run())
    print(f"applied migrations: {', '.join(map(str, applied))}" if applied
          else "database is up to date")
    return 0


def cmd_fake_upstream(args: argparse.Namespace) -> int:
    from llm_gateway.testing.fake_upstream import serve_fake_upstream

    host, port = args.listen
    serve_fake_upstream(host, port, api_key=args.api_key, chunk_delay=args.chunk_delay,
                        chunk_count=args.chunks, usage_mode=args.usage_mode,
                        auth_header=args.auth_header)
    return 0


def cmd_sidecar(args: argparse.Namespace, rest: Sequence[str]) -> int:
    from llm_gateway.adapters.sidecar import sidecar_main

    return sidecar_main(list(rest), _settings(args))


def cmd_injector(args: argparse.Namespace, rest: Sequence[str]) -> int:
    from llm_gateway.k8s.main import injector_main

    return injector_main(list(rest))


# ---- keys -----------------------------------------------------------------------------

async def _with_store(settings: Settings, work):  # type: ignore[no-untyped-def]
    store: Store = open_store(settings.database_url)
    try:
        await store.migrate()
        return await work(store)
    finally:
        await store.close()


async def _create_key(
    settings: Settings, *, name: str, subject_id: str | None = None,
    rate_limit: tuple[int, int] = DEFAULT_RATE_LIMIT, models: tuple[str, ...] = (),
    expires_at: float | None = None,
) -> tuple[KeyRecord, str]:
    async def work(store: Store) -> tuple[KeyRecord, str]:
        record, key = new_key_record(
            name=name, subject_id=subject_id, now=time.time(),
            rate_limit_requests=rate_limit[0], rate_limit_window_seconds=rate_limit[1],
            allowed_models=models, expires_at=expires_at,
        )
        await store.insert_key(record)
        return record, key

    return await _with_store(settings, work)


def _key_json(record: KeyRecord) -> dict[str, object]:
    return {
        "id": record.id, "prefix": record.prefix, "name": record.name,
        "subject_id": record.subject_id, "is_active": record.is_active,
        "revoked_at": record.revoked_at, "expires_at": record.expires_at,
        "created_at": record.created_at, "last_used_at": record.last_used_at,
        "rate_limit_requests": record.rate_limit_requests,
        "rate_limit_window_seconds": record.rate_limit_window_seconds,
        "allowed_models": list(record.allowed_models),
    }


def _print_new_key(record: KeyRecord, key: str, as_json: bool) -> None:
    if as_json:
        print(json.dumps({**_key_json(record), "key": key}))
        return
    print(f"id:      {record.id}")
    print(f"name:    {record.name} (subject {record.subject_id})")
    print(f"limit:   {record.rate_limit_requests} requests / {record.rate_limit_window_seconds}s")
    print(f"models:  {', '.join(record.allowed_models) or 'all'}")
    print("The key is shown once; store it now:")
    print(key)


def cmd_keys_create(args: argparse.Namespace) -> int:
    try:
        rate_limit = parse_rate_limit(args.rate_limit)
        expires_at = time.time() + parse_duration(args.expires_in) if args.expires_in else None
    except ValueError as exc:
        print(f"llm-gateway keys create: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    models = tuple(m.strip() for m in args.models.split(",") if m.strip()) if args.models else ()
    record, key = asyncio.run(_create_key(
        _settings(args), name=args.name, subject_id=args.subject, rate_limit=rate_limit,
        models=models, expires_at=expires_at,
    ))
    _print_new_key(record, key, args.json)
    return 0


def cmd_keys_list(args: argparse.Namespace) -> int:
    records: list[KeyRecord] = asyncio.run(
        _with_store(_settings(args), lambda store: store.list_keys())
    )
    if args.json:
        print(json.dumps([_key_json(r) for r in records]))
        return 0
    print(f"{'PREFIX':<13} {'NAME':<20} {'SUBJECT':<20} {'STATE':<8} {'LIMIT':<10} MODELS")
    now = time.time()
    for r in records:
        state = r.refusal(now) or "active"
        limit = f"{r.rate_limit_requests}/{r.rate_limit_window_seconds}s"
        print(f"{r.prefix:<13} {r.name[:20]:<20} {r.subject_id[:20]:<20} {state:<8} {limit:<10} "
              f"{','.join(r.allowed_models) or 'all'}")
    return 0


async def _find(store: Store, prefix_or_id: str) -> KeyRecord:
    record = await store.find_key(prefix_or_id)
    if record is None:
        raise LookupError(f"no key with prefix or id {prefix_or_id!r}")
    return record


def cmd_keys_revoke(args: argparse.Namespace) -> int:
    async def work(store: Store) -> KeyRecord:
        record = await _find(store, args.key)
        await store.revoke_key(record.id, time.time())
        return record

    try:
        record = asyncio.run(_with_store(_settings(args), work))
    except LookupError as exc:
        print(f"llm-gateway keys revoke: {exc}", file=sys.stderr)
        return 1
    print(f"revoked {record.prefix}… ({record.name}); every gateway refuses it within seconds")
    return 0


def cmd_keys_rotate(args: argparse.Namespace) -> int:
    async def work(store: Store) -> tuple[KeyRecord, str]:
        old = await _find(store, args.key)
        record, key = new_key_record(
            name=old.name, subject_id=old.subject_id, now=time.time(),
            rate_limit_requests=old.rate_limit_requests,
            rate_limit_window_seconds=old.rate_limit_window_seconds,
            allowed_models=old.allowed_models, expires_at=old.expires_at,
        )
        await store.insert_key(record)
        await store.revoke_key(old.id, time.time())
        return record, key

    try:
        record, key = asyncio.run(_with_store(_settings(args), work))
    except LookupError as exc:
        print(f"llm-gateway keys rotate: {exc}", file=sys.stderr)
        return 1
    _print_new_key(record, key, args.json)
    return 0


# ---- parser ---------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="llm-gateway", description=__doc__)
    parser.add_argument("--config", metavar="FILE",
                        help="YAML settings file (or LLM_GATEWAY_CONFIG); the environment wins")
    commands = parser.add_subparsers(dest="command", required=True)

    commands.add_parser("serve", help="run the gateway (needs VENICE_API_KEY)").set_defaults(
        handler=cmd_serve)
    commands.add_parser(
        "demo", help="run the gateway in front of the bundled fake upstream, with a dev key"
    ).set_defaults(handler=cmd_demo)
    commands.add_parser("migrate", help="apply database migrations and exit").set_defaults(
        handler=cmd_migrate)

    fake = commands.add_parser("fake-upstream", help="run the bundled fake OpenAI/Venice server")
    fake.add_argument("--listen", type=host_port_argument, default="127.0.0.1:3001")
    fake.add_argument("--api-key", default="sk-fake-upstream")
    fake.add_argument("--chunk-delay", type=float, default=0.0, help="seconds between chunks")
    fake.add_argument("--chunks", type=int, default=8)
    fake.add_argument("--usage-mode", choices=["venice", "openai"], default="venice")
    fake.add_argument("--auth-header", default="authorization",
                      help="where the fake expects its key: authorization (Bearer) or a header")
    fake.set_defaults(handler=cmd_fake_upstream)

    commands.add_parser(
        "sidecar", help="run the mitmproxy sidecar (HTTPS_PROXY or reverse proxy)", add_help=False
    ).set_defaults(handler=cmd_sidecar, passthrough=True)
    commands.add_parser(
        "injector", help="run the Kubernetes pod-injection webhook", add_help=False
    ).set_defaults(handler=cmd_injector, passthrough=True)

    keys = commands.add_parser("keys", help="manage gateway keys").add_subparsers(
        dest="keys_command", required=True)
    create = keys.add_parser("create", help="create a key and print it once")
    create.add_argument("--name", required=True)
    create.add_argument("--subject", help="who the key belongs to (default: its name)")
    create.add_argument("--rate-limit", default="{}/{}".format(*DEFAULT_RATE_LIMIT),
                        metavar="N/SECONDS")
    create.add_argument("--models", help="comma-separated allowed models (default: all)")
    create.add_argument("--expires-in", metavar="DURATION", help="e.g. 30d, 12h")
    create.add_argument("--json", action="store_true")
    create.set_defaults(handler=cmd_keys_create)
    listing = keys.add_parser("list", help="list keys (prefixes only, never keys)")
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(handler=cmd_keys_list)
    revoke = keys.add_parser("revoke", help="revoke a key")
    revoke.add_argument("key", metavar="PREFIX|ID")
    revoke.set_defaults(handler=cmd_keys_revoke)
    rotate = keys.add_parser("rotate", help="issue a new key and revoke the old one")
    rotate.add_argument("key", metavar="PREFIX|ID")
    rotate.add_argument("--json", action="store_true")
    rotate.set_defaults(handler=cmd_keys_rotate)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    try:
        if getattr(args, "passthrough", False):
            return args.handler(args, rest)
        if rest:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        return args.handler(args)
    except ConfigError as exc:
        print(f"llm-gateway: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
