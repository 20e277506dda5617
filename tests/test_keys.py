"""Gateway keys: format, checksum, hashing, schema constraints, CLI, and storage at rest."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from llm_gateway.keys import (
    PREFIX_LENGTH,
    generate_key,
    hash_matches,
    is_well_formed,
    key_hash,
    key_prefix,
    new_key_record,
    parse_duration,
    parse_rate_limit,
)
from llm_gateway.stores.migrations import MIGRATIONS
from llm_gateway.stores.sqlite import SqliteStore
from tests.support import BIN, send_keys_as_prompts


def test_key_format_and_checksum() -> None:
    key = generate_key()
    assert key.startswith("llmg_") and len(key) == 5 + 32 + 6
    assert is_well_formed(key)
    assert len(key_prefix(key)) == PREFIX_LENGTH
    assert len(key_hash(key)) == 32 and hash_matches(key, key_hash(key))
    # Any single-character change is caught by the checksum, without a lookup.
    for position in range(5, len(key)):
        changed = key[:position] + ("x" if key[position] != "x" else "y") + key[position + 1:]
        assert not is_well_formed(changed)
    assert not is_well_formed("sk-" + key[5:])
    assert not is_well_formed(key + "a")


def test_durations_and_rate_limits() -> None:
    assert parse_duration("30d") == 30 * 86400 and parse_duration("90s") == 90
    assert parse_rate_limit("100/60") == (100, 60)
    for bad in ("0d", "3x", ""):
        with pytest.raises(ValueError):
            parse_duration(bad)
    for bad in ("0/60", "10/0", "ten/60", "10"):
        with pytest.raises(ValueError):
            parse_rate_limit(bad)


def _db(tmp_path: Path) -> tuple[str, sqlite3.Connection]:
    url = f"sqlite:///{tmp_path / 'keys.db'}"
    store = SqliteStore.from_url(url)
    asyncio.run(store.migrate())
    asyncio.run(store.close())
    return url, sqlite3.connect(tmp_path / "keys.db")


@pytest.mark.parametrize(("column", "value"), [
    ("prefix", "short"),
    ("key_hash", b"\x00" * 31),
    ("key_hash", "x" * 32),
    ("rate_limit_requests", 0),
    ("rate_limit_window_seconds", -5),
    ("revoked_at", 123.0),  # revoked while still active
])
def test_schema_refuses_what_must_never_be(tmp_path: Path, column: str, value: object) -> None:
    _, db = _db(tmp_path)
    record, _ = new_key_record(name="n", subject_id=None, now=time.time())
    row = {
        "id": record.id, "subject_id": "s", "name": "n", "prefix": record.prefix,
        "key_hash": record.key_hash, "is_active": 1, "created_at": time.time(), column: value,
    }
    with pytest.raises(sqlite3.IntegrityError):
        db.execute(f"INSERT INTO gateway_keys ({', '.join(row)}) "
                   f"VALUES ({', '.join('?' * len(row))})", tuple(row.values()))


def test_migrations_are_versioned_and_idempotent(tmp_path: Path) -> None:
    url, db = _db(tmp_path)
    versions = db.execute("SELECT version FROM schema_migrations ORDER BY version").fetchall()
    assert versions == [(m.version,) for m in MIGRATIONS]
    result = subprocess.run([str(BIN / "llm-gateway"), "migrate"], capture_output=True,
                            text=True, env={**os.environ, "DATABASE_URL": url}, timeout=30)
    assert result.returncode == 0 and "up to date" in result.stdout


def cli(*args: str, database_url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "llm-gateway"), *args], capture_output=True, text=True,
                          env={**os.environ, "DATABASE_URL": database_url}, timeout=30)


def test_cli_create_list_revoke_rotate(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    created = cli("keys", "create", "--name", "svc", "--subject", "team-a", "--rate-limit",
                  "10/30", "--models", "a,b", "--expires-in", "30d", database_url=url)
    assert created.returncode == 0, created.stderr
    key = created.stdout.strip().splitlines()[-1]
    assert is_well_formed(key)
    as_json = json.loads(cli("keys", "create", "--name", "j", "--json", database_url=url).stdout)
    assert is_well_formed(as_json["key"])

    listing = cli("keys", "list", database_url=url).stdout
    assert key_prefix(key) in listing and key not in listing
    entries = json.loads(cli("keys", "list", "--json", database_url=url).stdout)
    svc = next(e for e in entries if e["name"] == "svc")
    assert svc["subject_id"] == "team-a" and svc["allowed_models"] == ["a", "b"]
    assert (svc["rate_limit_requests"], svc["rate_limit_window_seconds"]) == (10, 30)
    assert 29 * 86400 < svc["expires_at"] - time.time() <= 30 * 86400
    assert all("key" not in e and "key_hash" not in e for e in entries)

    rotated = cli("keys", "rotate", key_prefix(key), database_url=url)
    assert rotated.returncode == 0, rotated.stderr
    new_key = rotated.stdout.strip().splitlines()[-1]
    assert is_well_formed(new_key) and new_key != key
    entries = {e["prefix"]: e for e in json.loads(
        cli("keys", "list", "--json", database_url=url).stdout)}
    assert entries[key_prefix(key)]["revoked_at"] is not None
    assert entries[key_prefix(new_key)]["allowed_models"] == ["a", "b"]

    revoked = cli("keys", "revoke", as_json["id"], database_url=url)
    assert revoked.returncode == 0 and "revoked" in revoked.stdout
    missing = cli("keys", "revoke", "llmg_nothere", database_url=url)
    assert missing.returncode == 1 and "no key" in missing.stderr
    bad = cli("keys", "create", "--name", "x", "--rate-limit", "0/1", database_url=url)
    assert bad.returncode == 2 and "REQUESTS/SECONDS" in bad.stderr


def test_revoked_key_is_refused_by_a_running_gateway(gw, fake) -> None:  # type: ignore[no-untyped-def]
    record, key = gw.key_with_record()
    headers = {"authorization": f"Bearer {key}"}
    assert httpx.get(gw.url + "/v1/models", headers=headers).status_code == 200
    assert cli("keys", "revoke", record.prefix, database_url=gw.database_url).returncode == 0
    assert httpx.get(gw.url + "/v1/models", headers=headers).status_code == 401


def test_sqlite_file_never_holds_a_key_in_plain_text(  # type: ignore[no-untyped-def]
    start_gateway, fake, tmp_path: Path
) -> None:
    # SQLite whatever the suite runs on: this scans the file (Postgres: test_postgres_store).
    gw = start_gateway(database_url=f"sqlite:///{tmp_path / 'scanned.db'}")
    keys = [gw.key(name=f"k{i}") for i in range(3)]
    send_keys_as_prompts(gw, keys)
    gw.records()
    database = Path(gw.database_url.removeprefix("sqlite:///"))
    files = [p for p in database.parent.iterdir() if p.name.startswith(database.name)]
    assert database in files
    contents = b"".join(p.read_bytes() for p in files)
    for key in keys:
        assert key.encode() not in contents
        assert key[12:].encode() not in contents  # not even the secret part
        assert key_prefix(key).encode() in contents  # the prefix is stored, for lookups
    assert b"sk-fake-upstream" not in contents


def test_last_used_at_is_written_in_batches_not_per_request(  # type: ignore[no-untyped-def]
    tmp_path: Path, fake_url, fake
) -> None:
    from asgi_middleware import create_app
    from llm_gateway.wiring import build_gateway
    from tests.conftest import make_settings
    from tests.support import create_key, serve_in_thread

    settings = make_settings(tmp_path, fake_url)
    record, key = create_key(settings.database_url)
    gateway = build_gateway(settings)

    def stored_last_used_at() -> float | None:  # through the store: SQLite or Postgres
        from llm_gateway.stores import open_store

        async def read() -> float | None:
            store = open_store(settings.database_url)
            try:
                found = await store.find_key(record.id)
            finally:
                await store.close()
            assert found is not None
            return found.last_used_at

        return asyncio.run(read())

    with serve_in_thread(create_app(settings, gateway=gateway)) as url:
        for _ in range(3):
            response = httpx.get(url + "/v1/models", headers={"authorization": f"Bearer {key}"})
            assert response.status_code == 200
        # Not yet written: touches are batched off the request path.
        assert stored_last_used_at() is None
    # Shutdown flushes the pending touch.
    last_used = stored_last_used_at()
    assert last_used is not None and abs(last_used - time.time()) < 30
