"""Providers are reached over HTTPS with their certificate verified: the gateway hands the
server-held key to a provider only once it has proved who it is. A provider behind a
private CA is trusted through the process's trust store (``SSL_CERT_FILE``), never by
turning verification off."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from llm_gateway.testing.fake_upstream import FakeUpstream, running_fake_upstream
from tests.support import create_key, fresh_database_url, gateway_process, self_signed_certificate

PROVIDER_KEY = "sk-fake-upstream"


@pytest.fixture(scope="module")
def tls_fake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FakeUpstream, str, Path]]:
    directory = tmp_path_factory.mktemp("provider-tls")
    cert, key, _ = self_signed_certificate(directory)
    with running_fake_upstream(FakeUpstream(api_key=PROVIDER_KEY), tls=(cert, key)) as (fake, url):
        assert url.startswith("https://")
        yield fake, url, cert


def _ask_through_gateway(tls_fake: tuple[FakeUpstream, str, Path], tmp_path: Path,
                         **env: str) -> httpx.Response:
    """One chat request through a `serve` process whose provider is the TLS fake."""
    fake, url, _ = tls_fake
    fake.reset()
    database_url = fresh_database_url(tmp_path)
    _, key = create_key(database_url)
    with gateway_process({"DATABASE_URL": database_url, "VENICE_API_KEY": PROVIDER_KEY,
                          "VENICE_BASE_URL": url, "USAGE_SPOOL_DIR": str(tmp_path / "spool"),
                          **env}) as public:
        return httpx.post(public + "/v1/chat/completions", timeout=30,
                          headers={"authorization": f"Bearer {key}"},
                          json={"model": "llama-3.3-70b", "max_tokens": 8,
                                "messages": [{"role": "user", "content": "hello over TLS"}]})


def test_a_provider_whose_certificate_is_trusted_answers(
    tls_fake: tuple[FakeUpstream, str, Path], tmp_path: Path
) -> None:
    answer = _ask_through_gateway(tls_fake, tmp_path, SSL_CERT_FILE=str(tls_fake[2]))
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"]
    assert [request.headers.get("authorization") for request in tls_fake[0].requests] == [
        f"Bearer {PROVIDER_KEY}"]


def test_a_provider_whose_certificate_is_not_trusted_never_sees_the_key(
    tls_fake: tuple[FakeUpstream, str, Path], tmp_path: Path
) -> None:
    # The system's roots only: the fake's certificate is not among them.
    answer = _ask_through_gateway(tls_fake, tmp_path)
    assert answer.status_code == 502, answer.text
    assert answer.json()["error"]["code"] == "upstream_unreachable"
    assert PROVIDER_KEY not in answer.text
    assert tls_fake[0].requests == []  # no TLS session, so no request and no key reached it
