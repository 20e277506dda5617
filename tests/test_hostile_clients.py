"""Bodies policy must read one way only, nesting without end, and a key table someone
holds locked: each a clear answer, in `serve` and in the reverse sidecar."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest

from tests.process_support import KINDS, gateway_kind
from tests.support import create_key


@pytest.fixture(params=KINDS)
def gateway(request: pytest.FixtureRequest, tmp_path: Path, fake_url: str,
            fake) -> Iterator[tuple[str, str, str]]:  # type: ignore[no-untyped-def]
    from tests.conftest import make_settings

    settings = make_settings(tmp_path, fake_url)
    key = create_key(settings.database_url, allowed_models=("allowed",))[1]
    env = {"DATABASE_URL": settings.database_url, "VENICE_API_KEY": "sk-fake-upstream",
           "VENICE_BASE_URL": fake_url}
    with gateway_kind(request.param, tmp_path, env) as (base, _):
        yield base, key, request.param


def post_raw(base: str, key: str, body: bytes) -> httpx.Response:
    return httpx.post(base + "/chat/completions", content=body, timeout=10,
                      headers={"authorization": f"Bearer {key}",
                               "content-type": "application/json"})


def test_a_key_twice_is_refused_not_read_one_way(gateway: tuple[str, str, str], fake) -> None:  # type: ignore[no-untyped-def]
    base, key, _ = gateway
    body = b'{"model": "other", "model": "allowed", "messages": [{"role": "user"}]}'
    response = post_raw(base, key, body)
    assert (response.status_code, response.json()["error"]["code"]) == (
        400, "invalid_request_body")
    assert "'model' appears more than once" in response.json()["error"]["message"]
    assert fake.requests == []


@pytest.mark.parametrize("opening", [b"[", b'{"a":'])
def test_nesting_without_end_is_a_400(gateway: tuple[str, str, str], opening: bytes) -> None:
    base, key, _ = gateway
    closing = b"]" if opening == b"[" else b"}"
    body = b'{"model": "allowed", "messages": [{"role": "user", "content": ' + \
        opening * 1000 + b"1" + closing * 1000 + b"}]}"
    response = post_raw(base, key, body)
    assert (response.status_code, response.json()["error"]["code"]) == (
        400, "invalid_request_body")


def test_a_locked_key_table_answers_within_seconds(tmp_path: Path, fake_url: str,
                                                   postgres_url: str) -> None:
    key = create_key(postgres_url)[1]
    env = {"DATABASE_URL": postgres_url, "VENICE_API_KEY": "sk-fake-upstream",
           "VENICE_BASE_URL": fake_url}
    with gateway_kind("serve", tmp_path, env) as (base, _):
        root = base.removesuffix("/v1")
        with _locked(postgres_url, "gateway_keys"):
            started = time.monotonic()
            response = httpx.post(base + "/chat/completions", timeout=30,
                                  json={"model": "m", "messages": [{"role": "user"}]},
                                  headers={"authorization": f"Bearer {key}"})
            took = time.monotonic() - started
            ready = httpx.get(root + "/readyz", timeout=30)
        assert (response.status_code, response.json()["error"]["code"]) == (
            503, "key_store_unavailable")
        assert took < 4, f"{took:.1f} s"
        assert ready.status_code == 503
        assert httpx.get(root + "/readyz", timeout=10).status_code == 200  # and back


@contextlib.contextmanager
def _locked(url: str, table: str) -> Iterator[None]:
    """``table`` held in ACCESS EXCLUSIVE mode by another session, as a long migration
    would, until the block ends."""
    release = threading.Event()
    locked = threading.Event()

    def hold() -> None:
        with psycopg.connect(url) as conn, conn.transaction():
            conn.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
            locked.set()
            release.wait(30)

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    assert locked.wait(10)
    try:
        yield
    finally:
        release.set()
        holder.join(10)
