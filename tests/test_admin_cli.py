"""The admin plane's commands (admin-tokens, audit, keys disable/enable/show/update, prices,
budgets, providers), `serve`'s admin listener, and provider keys at rest."""

from __future__ import annotations

import asyncio
import base64
import csv
import io
import json
import os
import socket
import subprocess
import time
from decimal import Decimal
from pathlib import Path

import httpx
import pytest

from llm_gateway.admin.tokens import generate_token, is_well_formed_token
from llm_gateway.billing.records import UsageRecord
from llm_gateway.config import Secret, load_settings
from llm_gateway.crypto import CannotDecrypt, SecretBox, SecretKeyError, derive_key, mask_secret
from llm_gateway.keys import generate_key, is_well_formed, new_key_record
from llm_gateway.stores import open_store
from tests.support import (
    BIN,
    free_port,
    fresh_database_url,
    gateway_process,
    stop_process,
    wait_until_up,
)

SECRET = base64.b64encode(bytes(range(32))).decode()


def cli(*args: str, database_url: str, stdin: str | None = None,
        **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "llm-gateway"), *args], capture_output=True, text=True, input=stdin,
        env={**os.environ, "DATABASE_URL": database_url, **env}, timeout=30)


def test_admin_tokens_create_list_revoke(tmp_path: Path) -> None:
    url = fresh_database_url(tmp_path)
    created = cli("admin-tokens", "create", "--name", "alice", database_url=url)
    assert created.returncode == 0, created.stderr
    token = created.stdout.strip().splitlines()[-1]
    assert is_well_formed_token(token)
    as_json = json.loads(cli("admin-tokens", "create", "--name", "robot", "--json",
                             database_url=url).stdout)
    assert is_well_formed_token(as_json["token"]) and as_json["name"] == "robot"
    again = cli("admin-tokens", "create", "--name", "alice", database_url=url)
    assert again.returncode == 1 and "already named 'alice'" in again.stderr

    listing = cli("admin-tokens", "list", database_url=url).stdout
    assert token[:13] in listing and token not in listing
    entries = json.loads(cli("admin-tokens", "list", "--json", database_url=url).stdout)
    assert {e["name"] for e in entries} == {"alice", "robot"}
    assert all("token" not in e and "token_hash" not in e for e in entries)

    revoked = cli("admin-tokens", "revoke", token[:13], database_url=url)
    assert revoked.returncode == 0 and "revoked" in revoked.stdout
    # The name is free again once its token is revoked.
    assert cli("admin-tokens", "create", "--name", "alice", database_url=url).returncode == 0
    missing = cli("admin-tokens", "revoke", "llmga_nothere", database_url=url)
    assert missing.returncode == 1 and "no admin token" in missing.stderr


def test_keys_disable_enable_show_update_through_the_service(tmp_path: Path) -> None:
    url = fresh_database_url(tmp_path)
    key = cli("keys", "create", "--name", "svc", database_url=url).stdout.strip().splitlines()[-1]
    prefix = key[:12]
    assert "disabled" in cli("keys", "disable", prefix, database_url=url).stdout
    shown = json.loads(cli("keys", "show", prefix, "--json", database_url=url).stdout)
    assert shown["state"] == "disabled" and shown["is_active"] is False
    assert "enabled" in cli("keys", "enable", prefix, database_url=url).stdout
    updated = cli("keys", "update", prefix, "--name", "svc-2", "--rate-limit", "5/10",
                  "--models", "a,b", "--expires-in", "7d", "--json", database_url=url)
    assert updated.returncode == 0, updated.stderr
    fields = json.loads(updated.stdout)
    assert (fields["name"], fields["rate_limit_requests"], fields["allowed_models"]) == (
        "svc-2", 5, ["a", "b"])
    cleared = json.loads(cli("keys", "update", prefix, "--all-models", "--no-expiry", "--json",
                             database_url=url).stdout)
    assert cleared["allowed_models"] == [] and cleared["expires_at"] is None
    text = cli("keys", "show", prefix, database_url=url).stdout
    assert "state:   active" in text and key not in text

    assert cli("keys", "revoke", prefix, database_url=url).returncode == 0
    for command in ("enable", "disable", "rotate"):
        refused = cli("keys", command, prefix, database_url=url)
        assert refused.returncode == 1 and "a revoked key cannot be" in refused.stderr, command
    bad = cli("keys", "update", prefix, "--rate-limit", "x", database_url=url)
    assert bad.returncode == 2

    events = json.loads(cli("audit", "list", "--json", "--limit", "50", database_url=url).stdout)
    assert [e["action"] for e in reversed(events)] == [
        "key.create", "key.disable", "key.enable", "key.update", "key.update", "key.revoke"]
    assert {e["actor"] for e in events} == {"cli"}
    assert key not in json.dumps(events)
    table = cli("audit", "list", "--limit", "2", database_url=url).stdout.splitlines()
    assert table[0].startswith("WHEN") and len(table) == 3 and "key.revoke" in table[1]


def test_prices_and_budgets(tmp_path: Path) -> None:
    url = fresh_database_url(tmp_path)
    set_price = cli("prices", "set", "--provider", "venice", "--model", "llama-3.3-70b",
                    "--input", "0.70", "--output", "2.8", "--cached-input", "0.35",
                    "--from", "2025-01-01T00:00:00Z", database_url=url)
    assert set_price.returncode == 0, set_price.stderr
    assert "input 0.70, output 2.80" in set_price.stdout
    prices = json.loads(cli("prices", "list", "--json", database_url=url).stdout)
    assert prices == [{"provider": "venice", "model": "llama-3.3-70b", "input_per_mtok": "0.70",
                       "output_per_mtok": "2.80", "cached_input_per_mtok": "0.35",
                       "cache_write_per_mtok": None, "cache_write_1h_per_mtok": None,
                       "effective_from": 1735689600.0, "source": "operator",
                       "long_context_above": None, "long_context": None}]
    # Money is exact: 0.1 + 0.2 stays 0.3 (a float would not).
    cli("prices", "set", "--provider", "p", "--model", "m", "--input", "0.1000000001",
        "--output", "0.3", database_url=url)
    listed = json.loads(cli("prices", "list", "--json", database_url=url).stdout)
    assert listed[0]["input_per_mtok"] == "0.1000000001"
    bad = cli("prices", "set", "--provider", "p", "--model", "m", "--input", "cheap",
              "--output", "1", database_url=url)
    assert bad.returncode == 2 and "decimal" in bad.stderr

    key = cli("keys", "create", "--name", "svc", "--subject", "team-a",
              database_url=url).stdout.strip().splitlines()[-1]
    budget = cli("budgets", "set", "--subject", "team-a", "--daily-usd", "5", "--monthly-usd",
                 "100.25", "--tokens-per-minute", "10000", "--over-cap", "reject",
                 "--stop-streams-at-budget", "--json", database_url=url)
    assert budget.returncode == 0, budget.stderr
    assert json.loads(budget.stdout) == {
        "scope": "subject", "scope_id": "team-a", "daily_usd": "5.00", "monthly_usd": "100.25",
        "daily_tokens": None, "monthly_tokens": None, "tokens_per_minute": 10000,
        "max_output_tokens": None, "over_cap": "reject", "stop_streams_at_budget": True}
    # Only the options given change; 'none' removes a limit.
    changed = json.loads(cli("budgets", "set", "--subject", "team-a", "--daily-usd", "none",
                             "--no-stop-streams-at-budget", "--json", database_url=url).stdout)
    assert changed["daily_usd"] is None and changed["monthly_usd"] == "100.25"
    assert changed["stop_streams_at_budget"] is False
    assert cli("budgets", "set", "--key", key[:12], "--max-output-tokens", "256",
               database_url=url).returncode == 0
    shown = json.loads(cli("budgets", "show", "--key", key[:12], "--json", database_url=url).stdout)
    assert shown["max_output_tokens"] == 256 and shown["scope"] == "key"
    every = json.loads(cli("budgets", "show", "--json", database_url=url).stdout)
    assert {b["scope"] for b in every} == {"key", "subject"}
    assert all("spent_today_usd" in b for b in every)
    text = cli("budgets", "show", database_url=url).stdout
    assert "subject team-a" in text and "no limit" in text
    assert cli("budgets", "set", database_url=url).returncode == 2  # --key or --subject
    missing = cli("budgets", "show", "--subject", "nobody", database_url=url)
    assert missing.returncode == 1 and "no budget" in missing.stderr


def test_counts_past_their_column_are_refused_in_one_line(tmp_path: Path) -> None:
    url = fresh_database_url(tmp_path)
    for option in ("--daily-tokens", "--max-output-tokens"):
        refused = cli("budgets", "set", "--subject", "team-a", option, str(2**64),
                      database_url=url)
        assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
        assert option[2:].replace("-", "_") in refused.stderr
    too_many = cli("keys", "create", "--name", "x", "--rate-limit", f"{2**31}/60",
                   database_url=url)
    assert too_many.returncode == 2 and "rate_limit_requests" in too_many.stderr
    assert "Traceback" not in refused.stderr + too_many.stderr


# Model names as callers chose them (a request's "model" is recorded as sent).
FORMULA_MODELS = ['=HYPERLINK("http://x","y")', "+SUM(1+1)", "-2+3", "@SUM(A1)",
                  "\tx", "\r=cmd", "-2"]


def test_the_usage_reports_csv_runs_no_formula(tmp_path: Path) -> None:
    url = fresh_database_url(tmp_path)
    key, _ = new_key_record(name="=key", subject_id="+team", now=time.time())
    records = [UsageRecord(
        request_id=f"req_{index}", key_id=key.id, key_prefix=key.prefix,
        subject_id=key.subject_id, adapter="asgi", endpoint="/chat/completions", model=model,
        stream=False, status=200, started_at=time.time() - 60, duration_ms=10.0,
        prompt_tokens=1, completion_tokens=1, total_tokens=2,
        # A credit: the report's own negative amount is a number, and stays one.
        cost_usd=Decimal("-0.5") if model == "-2" else Decimal("0.25"),
    ) for index, model in enumerate(FORMULA_MODELS)]

    async def write() -> None:
        store = open_store(url)
        try:
            await store.migrate()
            await store.insert_key(key)
            await store.write_usage(records)
        finally:
            await store.close()

    asyncio.run(write())

    def report(by: str) -> list[dict[str, str]]:
        # As bytes: text mode would read the CR in a cell as a line's end.
        done = subprocess.run(
            [str(BIN / "llm-gateway"), "usage", "report", "--by", by, "--format", "csv"],
            capture_output=True, env={**os.environ, "DATABASE_URL": url}, timeout=30)
        assert done.returncode == 0, done.stderr
        return list(csv.DictReader(io.StringIO(done.stdout.decode(), newline="")))

    rows = {row["model"]: row for row in report("model")}
    assert set(rows) == {"'=HYPERLINK(\"http://x\",\"y\")", "'+SUM(1+1)", "'-2+3",
                         "'@SUM(A1)", "'\tx", "'\r=cmd", "-2"}
    assert rows["-2"]["cost_usd"] == "-0.5" and rows["'@SUM(A1)"]["cost_usd"] == "0.25"
    [row] = report("key")
    assert (row["key_name"], row["subject"]) == ("'=key", "'+team")
    assert row["cost_usd"] == "1" and row["requests"] == str(len(FORMULA_MODELS))


def test_provider_keys_are_stored_encrypted_and_shown_masked(tmp_path: Path) -> None:
    # SQLite whatever the suite runs on: this scans the database file's bytes.
    url = f"sqlite:///{tmp_path / 'providers.db'}"
    provider_key = "sk-venice-" + "q" * 24 + "9f3c"
    refused = cli("providers", "set-key", "venice", database_url=url, stdin=provider_key + "\n")
    assert refused.returncode == 2
    assert refused.stderr.count("\n") == 1 and "LLM_GATEWAY_SECRET_KEY" in refused.stderr
    stored = cli("providers", "set-key", "venice", database_url=url, stdin=provider_key + "\n",
                 LLM_GATEWAY_SECRET_KEY=SECRET)
    assert stored.returncode == 0, stored.stderr
    assert "sk-v…9f3c" in stored.stdout and provider_key not in stored.stdout
    listing = cli("providers", "list", database_url=url, LLM_GATEWAY_SECRET_KEY=SECRET).stdout
    assert "sk-v…9f3c" in listing and provider_key not in listing
    blind = cli("providers", "list", "--json", database_url=url).stdout
    assert json.loads(blind)[0]["key"] is None  # no secret: not even the mask
    events = cli("audit", "list", "--json", database_url=url).stdout
    assert "sk-v…9f3c" in json.loads(events)[0]["after"]["key"] and provider_key not in events
    database = tmp_path / "providers.db"
    contents = b"".join(p.read_bytes() for p in tmp_path.iterdir()
                        if p.name.startswith(database.name))
    assert provider_key.encode() not in contents and b"q" * 24 not in contents
    assert SECRET.encode() not in contents


def test_secret_key_rules_and_sealing() -> None:
    raw = bytes(range(32))
    assert derive_key(base64.b64encode(raw).decode()) == raw
    assert derive_key(base64.urlsafe_b64encode(raw).decode().rstrip("=")) == raw
    passphrase = "correct horse battery staple, and then some more"
    assert derive_key(passphrase) == derive_key(passphrase) != derive_key(passphrase + "!")
    with pytest.raises(SecretKeyError):
        derive_key("too short")
    box = SecretBox.from_secret(Secret(passphrase))
    nonce, sealed = box.seal("sk-secret", context="venice")
    assert b"sk-secret" not in sealed and box.open(nonce, sealed, context="venice") == "sk-secret"
    assert box.seal("sk-secret", context="venice")[0] != nonce  # a fresh nonce each time
    with pytest.raises(CannotDecrypt):
        box.open(nonce, sealed, context="openai")  # copied onto another provider's row
    with pytest.raises(CannotDecrypt):
        SecretBox(bytes(32)).open(nonce, sealed, context="venice")
    assert mask_secret("sk-abcdef0123456789f3c") == "sk-a…9f3c"
    assert mask_secret("short") == "****"


def test_admin_tokens_and_gateway_keys_never_pass_for_each_other() -> None:
    for _ in range(200):
        key, token = generate_key(), generate_token()
        assert is_well_formed(key) and not is_well_formed_token(key)
        assert is_well_formed_token(token) and not is_well_formed(token)


def test_serve_runs_the_admin_listener_beside_the_public_one(tmp_path: Path, fake_url: str) -> None:
    url = fresh_database_url(tmp_path)
    token = cli("admin-tokens", "create", "--name", "ops", database_url=url).stdout.split()[-1]
    admin_port = free_port()
    env = {"DATABASE_URL": url, "VENICE_API_KEY": "sk-fake-upstream", "VENICE_BASE_URL": fake_url,
           "ADMIN_BIND_ADDR": f"127.0.0.1:{admin_port}"}
    with gateway_process(env) as public:
        admin = f"http://127.0.0.1:{admin_port}"
        headers = {"authorization": f"Bearer {token}"}
        created = httpx.post(admin + "/admin/v1/keys", json={"name": "svc"}, headers=headers)
        assert created.status_code == 201
        key = created.json()["key"]
        answer = httpx.post(public + "/v1/chat/completions", headers={
            "authorization": f"Bearer {key}"}, json={"model": "llama-3.3-70b", "messages": [
                {"role": "user", "content": "hi"}]}, timeout=10)
        assert answer.status_code == 200
        assert httpx.get(public + "/admin/v1/keys", headers=headers).status_code == 404
        assert httpx.get(public + "/admin/").status_code == 404
        assert httpx.get(admin + "/admin/").status_code == 200
        # The same gateway: a disable through the admin listener is seen at once.
        httpx.post(admin + f"/admin/v1/keys/{key[:12]}/disable", headers=headers)
        refused = httpx.get(public + "/v1/models", headers={"authorization": f"Bearer {key}"})
        assert refused.status_code == 401


def test_serve_without_its_admin_listener(tmp_path: Path, fake_url: str) -> None:
    url = fresh_database_url(tmp_path)
    base_env = {"DATABASE_URL": url, "VENICE_API_KEY": "sk-fake-upstream",
                "VENICE_BASE_URL": fake_url}
    assert load_settings({"ADMIN_BIND_ADDR": "off"}).admin_bind is None
    taken = free_port()
    with gateway_process({**base_env, "ADMIN_BIND_ADDR": "off"}) as public:
        assert httpx.get(public + "/healthz").status_code == 200
    # A taken admin address is logged; the public API serves regardless.
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", taken))
        holder.listen()
        port = free_port()
        process = subprocess.Popen(
            [str(BIN / "llm-gateway"), "serve"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, env={**os.environ, **base_env, "BIND_ADDR": f"127.0.0.1:{port}",
                            "ADMIN_BIND_ADDR": f"127.0.0.1:{taken}"})
        try:
            wait_until_up(f"http://127.0.0.1:{port}/healthz", process)
        finally:
            stop_process(process)
        output = process.stdout.read() if process.stdout else ""
    assert f"listener 127.0.0.1:{taken} not started" in output
