"""Attribution and lookup: a request's tags (``x-llm-gateway-tags``, a body's ``metadata``)
and end user (``user``; Messages' ``metadata.user_id``) reach its usage record (the store,
the spool, the access log); reports group by a tag and by end user; ``llm-gateway usage
show`` and ``GET /admin/v1/usage/{request_id}`` find a request by its x-request-id or its
x-trace-id. On SQLite, and on Postgres with TEST_DATABASE_URL."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest

from llm_gateway.billing.records import UsageRecord
from llm_gateway.billing.spool import Spool
from llm_gateway.stores import open_store
from llm_gateway.telemetry.access_log import AccessLog
from llm_gateway.testing.fake_upstream import FakeUpstream
from tests.conftest import make_settings
from tests.support import BIN, create_key, usage_records
from tests.surfaces import SURFACES, Surface, surface, wait_until
from tests.test_admin_api import (  # noqa: F401 (fixtures)
    AdminGateway,
    OpenApi,
    admin_gw,
    in_new_loop,
    openapi,
)
from tests.test_console import browser, open_page, sign_in  # noqa: F401 (fixtures)

CHAT = {"model": "llama-3.3-70b", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(params=SURFACES)
def on(request: pytest.FixtureRequest, tmp_path: Path, fake_url: str,
       fake: FakeUpstream) -> Iterator[Surface]:
    with surface(request.param, tmp_path / request.param, fake_url, tmp_path / "ca") as it:
        yield it


def stored(on: Surface, count: int) -> list[UsageRecord]:
    """The store's records, once ``count`` are written."""
    found: list[UsageRecord] = []

    def written() -> bool:
        on.gateway.flush_from_thread()
        found[:] = usage_records(on.database_url)
        return len(found) >= count

    wait_until(written, 10, "records written")
    return found


def test_tags_and_the_end_user_reach_the_record_on_every_surface(on: Surface) -> None:
    key = on.key()
    answer = on.send("/chat/completions", json.dumps({**CHAT, "user": "user-42"}).encode(),
                     {"authorization": f"Bearer {key}",
                      "x-llm-gateway-tags": "feature=search, env=prod"})
    assert answer.status == 200, answer.body[:300]
    [record] = stored(on, 1)
    assert record.tags == {"feature": "search", "env": "prod"}
    assert record.end_user == "user-42"
    assert record.request_id == answer.header("x-request-id")
    assert record.trace_id == answer.header("x-trace-id")


def test_metadata_are_tags_and_messages_name_their_end_user(tmp_path: Path, fake_url: str,
                                                            fake: FakeUpstream) -> None:
    with surface("serve", tmp_path / "serve", fake_url, tmp_path / "ca") as on:
        key = on.key()
        metadata = {"feature": "chat", "env": "dev", "bad key": "left off",
                    "long": "v" * 300}
        sent = on.send("/chat/completions", json.dumps(
            {**CHAT, "metadata": metadata}).encode(),
            {"authorization": f"Bearer {key}", "x-llm-gateway-tags": "env=prod"})
        assert sent.status == 200, sent.body[:300]
        # Messages' metadata.user_id is its end user (the header's tags beside it).
        messages = {"model": "llama-3.3-70b", "max_tokens": 16,
                    "messages": [{"role": "user", "content": "hi"}],
                    "metadata": {"user_id": "anthropic-user"}}
        answer = on.send("/messages", json.dumps(messages).encode(),
                         {"authorization": f"Bearer {key}"})
        assert answer.status == 200, answer.body[:300]
        first, second = stored(on, 2)
        # The header's tag wins over the metadata's; a pair no tag could be is left off.
        assert first.tags == {"env": "prod", "feature": "chat"}
        assert first.end_user is None
        assert (second.protocol, second.end_user, second.tags) == (
            "messages", "anthropic-user", {})


def seeded(database_url: str) -> list[UsageRecord]:
    """Six records by two features, two end users and one without either."""
    records = []
    for index, (feature, user, cost) in enumerate([
            ("search", "alice", "0.10"), ("search", "bob", "0.20"), ("chat", "alice", "0.30"),
            ("chat", "alice", "0.40"), (None, None, "0.50"), ("=cmd|x", "=evil", "0.01")]):
        records.append(UsageRecord(
            request_id=f"req_seed{index}", key_id=None, subject_id="team-a", adapter="serve",
            endpoint="chat.completions", model="chat-fast", stream=False, status=200,
            started_at=1_790_000_000 + index, duration_ms=10.0 + index, provider="p",
            upstream_model="llama-3.3-70b", prompt_tokens=10, completion_tokens=5,
            total_tokens=15, cost_usd=Decimal(cost), trace_id=f"{index:032x}",
            tags={"feature": feature, "env": "prod"} if feature else {}, end_user=user))

    async def write() -> None:
        store = open_store(database_url)
        try:
            await store.migrate()
            await store.write_usage(records)
        finally:
            await store.close()

    in_new_loop(write())  # a thread of its own: Playwright's loop may be running here
    return records


def cli(database_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"DATABASE_URL": database_url, "PATH": str(BIN)}
    return subprocess.run([str(BIN / "llm-gateway"), "usage", *args], env=env,
                          capture_output=True, text=True, timeout=60)


def report(database_url: str, *args: str) -> Any:
    done = cli(database_url, "report", *args, "--format", "json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_reports_group_by_a_tag_and_by_end_user(tmp_path: Path, fake_url: str) -> None:
    database_url = make_settings(tmp_path, fake_url).database_url
    seeded(database_url)
    by_feature = report(database_url, "--by", "tag:feature")
    totals = {row["tag:feature"]: (row["requests"], row["cost_usd"]) for row in by_feature}
    assert totals == {"search": (2, "0.3"), "chat": (2, "0.7"), None: (1, "0.5"),
                      "=cmd|x": (1, "0.01")}
    by_user = report(database_url, "--by", "end_user,tag:env")
    assert {(row["end_user"], row["tag:env"], row["requests"]) for row in by_user} == {
        ("alice", "prod", 3), ("bob", "prod", 1), (None, None, 1), ("=evil", "prod", 1)}
    # CSV still neutralises a caller's string that a spreadsheet would run.
    table = list(csv.DictReader(io.StringIO(cli(
        database_url, "report", "--by", "end_user", "--format", "csv").stdout)))
    assert "'=evil" in {row["end_user"] for row in table}
    refused = cli(database_url, "report", "--by", "tag:bad key")
    assert refused.returncode == 2 and "cannot group by" in refused.stderr


def test_usage_show_finds_a_request_by_either_id(tmp_path: Path, fake_url: str) -> None:
    database_url = make_settings(tmp_path, fake_url).database_url
    records = seeded(database_url)
    by_request = cli(database_url, "show", "req_seed1", "--format", "json")
    assert by_request.returncode == 0, by_request.stderr
    [view] = json.loads(by_request.stdout)
    assert (view["request_id"], view["end_user"], view["tags"]) == (
        "req_seed1", "bob", {"feature": "search", "env": "prod"})
    assert view["target"] == {"provider": "p", "upstream_model": "llama-3.3-70b"}
    assert view["cost"]["cost_usd"] == "0.2" and view["tokens"]["total"] == 15
    assert view["attempts"] == 1 and view["timings"]["duration_ms"] == 11.0
    by_trace = json.loads(cli(database_url, "show", records[2].trace_id or "",
                              "--format", "json").stdout)
    assert [v["request_id"] for v in by_trace] == ["req_seed2"]
    table = cli(database_url, "show", "req_seed3").stdout
    assert "req_seed3" in table and "alice" in table and "feature=chat" in table
    missing = cli(database_url, "show", "req_nothere")
    assert missing.returncode == 1 and "no request has the id" in missing.stderr


def test_the_admin_api_finds_a_request_by_either_id(
    admin_gw: AdminGateway, openapi: OpenApi,  # noqa: F811
) -> None:
    _, key = create_key(admin_gw.settings.database_url)
    answer = httpx.post(admin_gw.public + "/v1/chat/completions", json={**CHAT, "user": "u-7"},
                        headers={"authorization": f"Bearer {key}",
                                 "x-llm-gateway-tags": "feature=lookup"}, timeout=10)
    assert answer.status_code == 200
    admin_gw.gateway.flush_from_thread()
    with admin_gw.client() as c:
        for wanted in (answer.headers["x-request-id"], answer.headers["x-trace-id"]):
            found = openapi.check(c.get(f"/usage/{wanted}"))
            assert found.status_code == 200, found.text
            [view] = found.json()["records"]
            assert view["request_id"] == answer.headers["x-request-id"]
            assert (view["end_user"], view["tags"]) == ("u-7", {"feature": "lookup"})
            assert view["target"]["provider"] and view["status"] == 200
        missing = openapi.check(c.get("/usage/req_nothere"))
        assert missing.status_code == 404
        assert missing.json()["error"]["code"] == "not_found"


def test_the_spool_and_the_access_log_carry_them(tmp_path: Path) -> None:
    record = UsageRecord(request_id="req_a", key_id=None, subject_id="s", adapter="serve",
                         endpoint="chat.completions", model="m", stream=False, status=200,
                         started_at=1.0, duration_ms=1.0, tags={"feature": "x"},
                         end_user="caf\u00e9")
    assert UsageRecord.from_json(json.loads(json.dumps(record.to_json()))) == record
    # A line an earlier version spooled has neither: it is read with none.
    old = {k: v for k, v in record.to_json().items() if k not in ("tags", "end_user")}
    assert (UsageRecord.from_json(old).tags, UsageRecord.from_json(old).end_user) == ({}, None)
    spool = Spool(tmp_path / "spool")
    spool.finished(record)
    assert spool.own_unwritten()[0][1] == [record]
    read, write = os.pipe()
    AccessLog(enabled=True, sample_rate=0, audit_errors=False, capture_content=False,
              fd=write).finished(record, b"{}", 0)
    line: dict[str, Any] = json.loads(os.read(read, 65536))
    os.close(read)
    os.close(write)
    assert (line["tags"], line["end_user"]) == ({"feature": "x"}, "caf\u00e9")



def test_the_console_finds_a_request_and_groups_by_end_user(
    browser: Any, admin_gw: AdminGateway,  # noqa: F811
) -> None:
    seeded(admin_gw.settings.database_url)
    page = browser.new_page(viewport={"width": 1280, "height": 860})
    sign_in(page, admin_gw)
    open_page(page, admin_gw, "usage")
    page.get_by_label("Request or trace id").fill(f"{2:032x}")  # req_seed2's trace id
    page.get_by_role("button", name="Find").click()
    dialog = page.get_by_role("dialog")
    dialog.wait_for()
    text = dialog.inner_text()
    assert "req_seed2" in text and "alice" in text and "feature=chat" in text
    assert "p / llama-3.3-70b" in text and "$0.30" in text
    dialog.get_by_role("button", name="Close").click()
    page.get_by_label("Request or trace id").fill("req_nothere")
    page.get_by_role("button", name="Find").click()
    page.get_by_text("No request has this id.").wait_for()
