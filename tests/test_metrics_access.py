"""Ports that expose only what they should: ``/metrics`` (its labels name keys and JWT
subjects) is never on a public port without a token, and the sidecar's pod-facing port
answers health and metrics only.

Before: ``serve`` answered ``/metrics`` on its public port to anyone, and the injected
sidecar served the whole admin API and an unauthenticated ``/metrics`` on ``0.0.0.0:9090``
of every app pod. Now ``METRICS_TOKEN`` (a bearer token) is asked on every listener when
set; without it, metrics with key labels are answered on loopback connections only
(``telemetry.metrics_access``); the sidecar's ``--probe`` port serves ``/healthz``,
``/readyz`` and ``/metrics`` and nothing else, and its admin API is loopback (or off).
"""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from llm_gateway.adapters.asgi import create_app
from llm_gateway.adapters.sidecar import parse_arguments
from llm_gateway.admin.app import create_admin_app
from llm_gateway.config import HostPort, Secret, Settings
from llm_gateway.telemetry.metrics_access import loopback, metrics_refusal
from llm_gateway.wiring import build_gateway
from tests.conftest import make_settings
from tests.support import create_key, need_service, serve_in_thread
from tests.test_sidecar import (  # noqa: F401
    ca_dir,
    in_process_gateway,
    sidecar_in_thread,
)

TOKEN = "metrics-token-for-tests"
POD_IP = ("10.1.2.3", 9090)


def public_address() -> str:
    """An address of this machine that is not loopback (a pod IP, say); skipped without."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1: no packet is sent
            address = probe.getsockname()[0]
        except OSError:
            address = ""
    need_service("an address of this machine besides loopback",
                 bool(address) and not address.startswith("127."))
    return address


def scrape(url: str, token: str | None = None) -> httpx.Response:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    return httpx.get(url + "/metrics", headers=headers, timeout=10)


# ---- the rule ----------------------------------------------------------------------------


def test_the_rule(tmp_path: Path) -> None:
    plain = Settings()
    tokened = dataclasses.replace(plain, metrics_token=Secret(TOKEN))
    keyless = dataclasses.replace(plain, metrics_key_label="none")
    assert metrics_refusal(plain, ("127.0.0.1", 3000), None) is None
    assert metrics_refusal(plain, ("::1", 3000), None) is None
    assert metrics_refusal(plain, ("/run/gateway.sock", None), None) is None  # a Unix socket
    refused = metrics_refusal(plain, POD_IP, None)
    assert refused is not None and (refused.status, refused.code) == (403, "endpoint_not_allowed")
    assert "METRICS_TOKEN" in refused.text and "METRICS_KEY_LABEL=none" in refused.text
    assert metrics_refusal(plain, None, None) is not None  # unknown: as a public port
    assert metrics_refusal(keyless, POD_IP, None) is None  # no key in its labels
    # A token, once set, is asked everywhere, loopback too.
    assert metrics_refusal(tokened, POD_IP, f"Bearer {TOKEN}") is None
    for wrong in (None, "Bearer nope", TOKEN, f"Basic {TOKEN}"):
        refused = metrics_refusal(tokened, ("127.0.0.1", 3000), wrong)
        assert refused is not None and (refused.status, refused.code) == (401, "invalid_api_key")
        assert ("www-authenticate", "Bearer") in refused.headers
        assert TOKEN not in refused.text
    assert loopback(("::ffff:127.0.0.1", 1)) and not loopback(("::ffff:10.0.0.1", 1))
    assert not loopback(("0.0.0.0", 1)) and not loopback(("not-an-ip", 1))


# ---- serve: the public port and the admin port --------------------------------------------


def test_serve_answers_metrics_on_its_public_port_only_as_the_rule_says(
        tmp_path: Path, fake_url: str) -> None:
    public = public_address()
    settings = make_settings(tmp_path, fake_url)
    app = create_app(settings, gateway=build_gateway(settings))
    with serve_in_thread(app, host="0.0.0.0") as url:
        port = httpx.URL(url).port
        pod = f"http://{public}:{port}"
        refused = scrape(pod)  # before: 200, with every key's prefix in it
        assert refused.status_code == 403, refused.text
        assert refused.json()["error"]["code"] == "endpoint_not_allowed"
        assert httpx.get(pod + "/healthz").status_code == 200  # the probes stay open
        assert scrape(f"http://127.0.0.1:{port}").status_code == 200  # loopback: this host
    tokened = make_settings(tmp_path / "t", fake_url, metrics_token=Secret(TOKEN))
    app = create_app(tokened, gateway=build_gateway(tokened))
    with serve_in_thread(app, host="0.0.0.0") as url:
        pod = f"http://{public}:{httpx.URL(url).port}"
        assert scrape(pod, TOKEN).status_code == 200
        assert "llm_gateway_requests_total" in scrape(pod, TOKEN).text
        assert scrape(pod).status_code == 401 and scrape(pod, "wrong").status_code == 401
        assert scrape(url).status_code == 401  # asked on loopback too, once set


async def asgi_get(app: object, path: str, server: tuple[str, int],
                   headers: list[tuple[bytes, bytes]] | None = None) -> tuple[int, bytes]:
    """One GET through an ASGI app, on a connection whose local address is ``server``."""
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": path, "query_string": b"",
             "headers": headers or [], "server": server, "client": ("10.9.9.9", 5555)}
    await app(scope, receive, send)  # type: ignore[operator]
    body = b"".join(message.get("body", b"") for message in sent[1:])
    return sent[0]["status"], body


async def test_the_admin_listener_and_the_middleware_follow_the_same_rule(
        tmp_path: Path, fake_url: str) -> None:
    settings = make_settings(tmp_path, fake_url)
    gateway = build_gateway(settings)
    for app in (create_admin_app(gateway), create_app(settings, gateway=gateway)):
        assert (await asgi_get(app, "/metrics", POD_IP))[0] == 403
        assert (await asgi_get(app, "/metrics", ("127.0.0.1", 3001)))[0] == 200
        assert (await asgi_get(app, "/healthz", POD_IP))[0] == 200
    tokened = build_gateway(dataclasses.replace(settings, metrics_token=Secret(TOKEN)))
    bearer = [(b"authorization", f"Bearer {TOKEN}".encode())]
    status, body = await asgi_get(create_admin_app(tokened), "/metrics", POD_IP, bearer)
    assert status == 200 and b"llm_gateway_" in body
    await gateway.close()
    await tokened.close()


# ---- the sidecar: a probe port, the admin API on loopback ---------------------------------


def test_the_sidecar_arguments() -> None:
    default = parse_arguments([])
    assert default.admin == HostPort("127.0.0.1", 9090) and default.probe is None
    pod = parse_arguments(["--probe", "0.0.0.0:9090", "--admin", "off"])
    assert pod.admin is None and pod.probe == HostPort("0.0.0.0", 9090)
    for clash in (["--probe", "0.0.0.0:9090"],  # the admin's default port
                  ["--probe", "0.0.0.0:8080", "--admin", "off"]):  # the proxy's
        with pytest.raises(SystemExit):
            parse_arguments(clash)


@pytest.fixture
def probed_sidecar(tmp_path: Path, fake_url: str, ca_dir: Path,  # noqa: F811
                   ) -> Iterator[tuple[str, str, str]]:
    """A regular sidecar with a probe port on every address, as the injector runs it:
    (the probe port's pod-IP URL, its loopback URL, the admin URL)."""
    public = public_address()
    gateway = in_process_gateway(tmp_path, fake_url, metrics_token=Secret(TOKEN))
    create_key(gateway.settings.database_url)
    with sidecar_in_thread(gateway, ca_dir, tmp_path, probe=("0.0.0.0", 0)) as sidecar:
        port = sidecar.sidecar.probe_address[1]  # type: ignore[index]
        yield f"http://{public}:{port}", f"http://127.0.0.1:{port}", sidecar.admin


def test_the_probe_port_answers_health_and_metrics_only(
        probed_sidecar: tuple[str, str, str]) -> None:
    pod, local, admin = probed_sidecar
    assert httpx.get(pod + "/healthz").json() == {"status": "ok"}
    assert httpx.get(pod + "/readyz").json()["status"] == "ready"  # the sidecar's readiness
    assert httpx.get(local + "/readyz").status_code == 200
    assert scrape(pod).status_code == 401
    assert "llm_gateway_" in scrape(pod, TOKEN).text
    # Before, this port was the admin API's: now none of it is here.
    for path in ("/admin/v1/keys", "/admin/v1/openapi.json", "/admin/", "/admin"):
        answer = httpx.get(pod + path)
        assert answer.status_code == 404, path
        assert answer.json()["error"]["code"] == "not_found"
    # The admin API listens on loopback.
    assert httpx.URL(admin).host == "127.0.0.1"
    assert httpx.get(admin + "/admin/v1/openapi.json").status_code == 200
