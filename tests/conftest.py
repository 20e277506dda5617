from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from asgi_middleware import create_app
from llm_gateway.billing.metering import UsageRecord
from llm_gateway.config import Secret, Settings
from llm_gateway.engine import Gateway
from llm_gateway.keys import KeyRecord
from llm_gateway.testing.fake_upstream import FakeUpstream, running_fake_upstream
from llm_gateway.testing.records import RecordedUsage
from llm_gateway.wiring import build_gateway
from tests.support import (
    POSTGRES_URL,
    REDIS_URL,
    SESSION_DATABASE,
    TEST_REDIS_URL,
    create_key,
    fresh_database_url,
    need_service,
    postgres_reachable,
    redis_reachable,
    serve_in_thread,
    usage_records,
)


@pytest.fixture(scope="session", autouse=True)
def _drop_session_database() -> Iterator[None]:
    """The Postgres database TEST_DATABASE_URL runs create, dropped once all is done."""
    yield
    SESSION_DATABASE.drop()


@pytest.fixture(scope="session")
def fake_server() -> Iterator[tuple[FakeUpstream, str]]:
    with running_fake_upstream(FakeUpstream()) as running:
        yield running


@pytest.fixture
def fake(fake_server: tuple[FakeUpstream, str]) -> FakeUpstream:
    fake_server[0].reset()
    return fake_server[0]


@pytest.fixture
def fake_url(fake_server: tuple[FakeUpstream, str], fake: FakeUpstream) -> str:
    return fake_server[1]


@dataclass
class RunningGateway:
    url: str
    gateway: Gateway
    database_url: str
    finished: RecordedUsage  # every usage record as its request finishes

    def key(self, **options: object) -> str:
        return create_key(self.database_url, **options)[1]

    def key_with_record(self, **options: object) -> tuple[KeyRecord, str]:
        return create_key(self.database_url, **options)

    def records(self) -> list[UsageRecord]:
        """Usage records as durably stored, after flushing what is pending."""
        self.gateway.flush_from_thread()
        return usage_records(self.database_url)


def make_settings(tmp_path: Path, upstream_url: str, **overrides: object) -> Settings:
    """A gateway's settings: SQLite in tmp_path, or (TEST_DATABASE_URL, TEST_REDIS_URL)
    a Postgres schema of its own and the Redis limiter."""
    settings = Settings(
        database_url=fresh_database_url(tmp_path),
        redis_url=TEST_REDIS_URL,
        # The test's own Redis keys (limits, shared health): one directory, one namespace.
        redis_namespace=f"llmg-test-{abs(hash(str(tmp_path))):x}",
        venice_api_key=Secret("sk-fake-upstream"),
        venice_base_url=upstream_url,
    )
    return dataclasses.replace(settings, **overrides)


@pytest.fixture
def start_gateway(tmp_path: Path, fake_url: str):  # type: ignore[no-untyped-def]
    """Start an in-thread gateway (real socket) with settings and upstream overrides."""
    stack: list = []

    def start(upstream_url: str | None = None, *, backoff_base: float = 0.01,
              **overrides: object) -> RunningGateway:
        settings = make_settings(tmp_path, upstream_url or fake_url, **overrides)
        gateway = build_gateway(settings, backoff_base=backoff_base, key_cache_seconds=0)
        finished = RecordedUsage()
        gateway.add_record_sink(finished)
        context = serve_in_thread(create_app(settings, gateway=gateway))
        url = context.__enter__()
        stack.append(context)
        return RunningGateway(url, gateway, settings.database_url, finished)

    yield start
    for context in reversed(stack):
        context.__exit__(None, None, None)


@pytest.fixture
def gw(start_gateway) -> RunningGateway:  # type: ignore[no-untyped-def]
    return start_gateway()


# ---- shared backends, for the tests that need them whatever the suite runs on ----------

@pytest.fixture
def postgres_url(tmp_path: Path) -> str:
    """A schema of this test's own in the session's Postgres database."""
    need_service(f"PostgreSQL at {POSTGRES_URL}", postgres_reachable())
    return SESSION_DATABASE.schema_for(tmp_path)


@pytest.fixture
def redis_url() -> str:
    """The shared Redis. Tests keep to keys of their own (fresh key ids); none flushes."""
    need_service(f"Redis at {REDIS_URL}", redis_reachable())
    return REDIS_URL
