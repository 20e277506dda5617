"""Known LLM hosts are never tunnelled ungoverned; every tunnel is logged and counted.

Tried as a new user would: default settings (``EGRESS_POLICY=allow``, ``llm_hosts`` holding
only Venice), an app calling ``api.openai.com`` or ``api.anthropic.com`` through the
sidecar with a provider key of its own. The sidecar knows the major providers' hosts
(``llm_gateway/data/known_llm_hosts.yaml``): such a host is governed when a provider serves
it, refused ``provider_not_configured`` in its clients' error shape when none does (under
either egress policy), and a host that is no LLM host still tunnels, logged and counted.
"""

from __future__ import annotations

import json
import logging
import re
import ssl
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from llm_gateway.adapters.mitm_tunnels import HostLabels
from llm_gateway.config import ConfigError, EgressPolicy, load_settings
from llm_gateway.engine import Gateway
from llm_gateway.known_hosts import KnownHosts, KnownHostsChange, hostname, parse_change
from llm_gateway.routing.client import UpstreamClient
from llm_gateway.routing.table import ProviderConfig
from llm_gateway.testing.fake_upstream import FakeUpstream
from llm_gateway.wiring import build_gateway
from tests.conftest import make_settings
from tests.support import create_key
from tests.test_sidecar import (  # noqa: F401
    CHAT,
    VENICE,
    ca_dir,
    connect_through,
    echo_server,
    in_process_gateway,
    origin_certificate,
    sidecar_in_thread,
)

pytestmark = pytest.mark.slow_once

A_REAL_PROVIDER_KEY = {"authorization": "Bearer sk-proj-an-apps-own-openai-key"}


def refusal(response: httpx.Response, host: str) -> str:
    """The refusal's message, once its status and shape-independent parts are checked."""
    assert response.status_code == 403, response.text
    assert response.headers["content-type"] == "application/json"
    assert response.headers["x-request-id"]  # answered by the gateway, through the engine
    assert host in response.text
    return response.text


# ---- known hosts no provider serves: refused, in their clients' shape ---------------------


@pytest.mark.parametrize("policy", [EgressPolicy.ALLOW, EgressPolicy.DENY])
def test_a_known_host_no_provider_serves_is_refused_under_either_policy(
        tmp_path: Path, fake_url: str, fake: FakeUpstream, ca_dir: Path,  # noqa: F811
        policy: EgressPolicy) -> None:
    gateway = in_process_gateway(tmp_path, fake_url, egress_policy=policy)
    with sidecar_in_thread(gateway, ca_dir, tmp_path) as sidecar, sidecar.client() as http:
        client = openai.OpenAI(base_url="https://api.openai.com/v1", max_retries=0,
                               api_key="sk-proj-an-apps-own-openai-key", http_client=http)
        with pytest.raises(openai.PermissionDeniedError) as refused:
            client.chat.completions.create(**CHAT)
        assert refused.value.code == "provider_not_configured"
        assert "api.openai.com" in refused.value.message
        assert fake.requests == []  # nothing went anywhere


# (host, path, the error body's shape)
SHAPES = [
    ("api.anthropic.com", "/v1/messages",
     lambda body: body["type"] == "error" and body["error"]["type"] == "permission_error"),
    ("generativelanguage.googleapis.com", "/v1beta/models/gemini-2.5-flash:generateContent",
     lambda body: body["error"]["code"] == 403 and body["error"]["status"] == "PERMISSION_DENIED"),
    ("europe-west4-aiplatform.googleapis.com", "/v1/projects/p/locations/l/publishers/google",
     lambda body: body["error"]["status"] == "PERMISSION_DENIED"),
    ("bedrock-runtime.us-east-1.amazonaws.com", "/model/anthropic.claude-v2/invoke",
     lambda body: set(body) == {"message"}),
    ("my-resource.openai.azure.com", "/openai/deployments/gpt/chat/completions",
     lambda body: body["error"]["code"] == "provider_not_configured"),
    ("api.mistral.ai", "/v1/chat/completions",
     lambda body: body["error"]["type"] == "permission_error"),
    ("api.cohere.com", "/v2/chat", lambda body: set(body) == {"message"}),
]


def test_each_known_host_is_refused_in_the_shape_its_clients_read(
        tmp_path: Path, fake_url: str, fake: FakeUpstream, ca_dir: Path) -> None:  # noqa: F811
    gateway = in_process_gateway(tmp_path, fake_url)
    with sidecar_in_thread(gateway, ca_dir, tmp_path) as sidecar, sidecar.client() as client:
        for host, path, shaped in SHAPES:
            response = client.post(f"https://{host}{path}", json=CHAT,
                                   headers=A_REAL_PROVIDER_KEY)
            refusal(response, host)
            assert shaped(response.json()), (host, response.text)
            if host.startswith("bedrock"):  # botocore reads the error's type from here
                assert response.headers["x-amzn-errortype"] == "AccessDeniedException"
        # Plain HTTP to one is refused alike, and so is anything that is not HTTP in a
        # tunnel to one: never relayed raw (mitmproxy's rawtcp is off).
        refusal(client.get("http://api.openai.com/v1/models"), "api.openai.com")
        sock, head = connect_through(sidecar.proxy, "api.openai.com:443")
        with sock:
            assert head.startswith(b"HTTP/1.1 200"), head
            sock.sendall(b"\x00\x01 not http nor tls\r\n\r\n")
            assert sock.recv(4096).startswith(b"HTTP/1.1 400")
    assert fake.requests == []


# ---- a known host a provider serves: governed ------------------------------------------


class ToTheFake(UpstreamClient):
    """The engine's upstream client, its https://api.openai.com sent to the fake instead
    (the test has no OpenAI): what is sent, and with which key, is the engine's."""

    def __init__(self, fake_url: str) -> None:
        super().__init__()
        self.fake_url = fake_url

    async def send(self, provider: ProviderConfig, method: str, url: str,
                   headers: list[tuple[str, str]], body: bytes, **options: Any) -> Any:
        url = url.replace("https://api.openai.com/v1", self.fake_url)
        return await super().send(provider, method, url, headers, body, **options)


def openai_served(tmp_path: Path, fake_url: str, monkeypatch: pytest.MonkeyPatch) -> Gateway:
    monkeypatch.setenv("OPENAI_TEST_KEY", "sk-fake-upstream")
    routes = {"providers": {"openai": {"base_url": "https://api.openai.com/v1",
                                       "api_key_env": "OPENAI_TEST_KEY", "profile": "venice"}}}
    return build_gateway(make_settings(tmp_path, fake_url, routes=routes),
                         client=ToTheFake(fake_url), key_cache_seconds=0)


def test_a_known_host_a_provider_serves_is_governed(
        tmp_path: Path, fake_url: str, fake: FakeUpstream, ca_dir: Path,  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    gateway = openai_served(tmp_path, fake_url, monkeypatch)
    key = create_key(gateway.settings.database_url)[1]
    with sidecar_in_thread(gateway, ca_dir, tmp_path) as sidecar, sidecar.client() as client:
        url = "https://api.openai.com/v1/chat/completions"
        answered = client.post(url, json=CHAT, headers={"authorization": f"Bearer {key}"})
        assert answered.status_code == 200, answered.text
        assert answered.headers["x-llm-gateway-upstream"] == "openai/llama-3.3-70b"
        # The app's own provider key is no gateway key: refused, never forwarded.
        unknown = client.post(url, json=CHAT, headers=A_REAL_PROVIDER_KEY)
        assert unknown.status_code == 401 and unknown.json()["error"]["code"] == "invalid_api_key"
        [record] = sidecar.records()
        assert (record.status, record.provider) == (200, "openai")
    [seen] = fake.requests
    assert seen.headers["authorization"] == "Bearer sk-fake-upstream"


# ---- other hosts: tunnelled, logged, counted; refused ones named ---------------------------


def tunnel_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records
            if record.getMessage().startswith("tunnel closed:")]


def test_a_host_that_is_no_llm_host_tunnels_and_is_logged_and_counted(
        tmp_path: Path, fake_url: str, ca_dir: Path, caplog: pytest.LogCaptureFixture,  # noqa: F811
        origin_certificate: tuple[Path, ssl.SSLContext, bytes]) -> None:  # noqa: F811
    caplog.set_level(logging.INFO, logger="llm_gateway.sidecar")
    gateway = in_process_gateway(tmp_path, fake_url)
    cert_path, server_context, _ = origin_certificate
    with (sidecar_in_thread(gateway, ca_dir, tmp_path) as sidecar,
          echo_server(server_context) as port):
        with httpx.Client(proxy=sidecar.proxy, verify=ssl.create_default_context(
                cafile=str(cert_path))) as client:  # the origin's certificate: untouched
            response = client.get(f"https://localhost:{port}/through")
        assert response.status_code == 200 and response.json()["path"] == "/through"
        deadline = time.monotonic() + 5
        while not tunnel_lines(caplog):
            assert time.monotonic() < deadline, "no log line for the tunnel"
            time.sleep(0.02)
        metrics = gateway.telemetry.metrics()[0].decode()
    [line] = tunnel_lines(caplog)
    found = re.fullmatch(r"tunnel closed: host=localhost port=(\d+) bytes_up=(\d+) "
                         r"bytes_down=(\d+) duration_s=([\d.]+)", line)
    assert found, line
    assert int(found[1]) == port and int(found[2]) > 200 and int(found[3]) > 500
    assert 'llm_gateway_sidecar_tunnels_total{host="localhost"} 1.0' in metrics
    # Start-up said which hosts are intercepted.
    started = next(record.getMessage() for record in caplog.records
                   if record.getMessage().startswith("intercepted hosts:"))
    assert "governed: 127.0.0.1:" in started and "api.venice.ai (/api/v1)" in started
    assert "api.openai.com" in started.partition("refused")[2]


def test_a_refused_connect_names_its_host(
        tmp_path: Path, fake_url: str, ca_dir: Path,  # noqa: F811
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="llm_gateway.sidecar")
    gateway = in_process_gateway(tmp_path, fake_url, egress_policy=EgressPolicy.DENY)
    with sidecar_in_thread(gateway, ca_dir, tmp_path) as sidecar:
        sock, head = connect_through(sidecar.proxy, "files.example.org:443")
        sock.close()
        assert head.startswith(b"HTTP/1.1 403")
        assert json.loads(head.partition(b"\r\n\r\n")[2])["error"]["code"] == "egress_denied"
        with sidecar.client() as client:
            refusal(client.get("https://api.anthropic.com/v1/models"), "api.anthropic.com")
    messages = [record.getMessage() for record in caplog.records]
    assert "refused CONNECT files.example.org:443: egress_denied" in messages
    assert ("refused GET api.anthropic.com:443: provider_not_configured (anthropic: no "
            "provider serves it)") in messages


# ---- the list, its settings, the labels --------------------------------------------------


def test_the_packaged_list_names_the_major_providers_and_matches_patterns() -> None:
    known = KnownHosts.packaged()
    for host, provider in [("api.openai.com", "openai"), ("API.Anthropic.com.", "anthropic"),
                           ("generativelanguage.googleapis.com", "gemini"),
                           ("us-central1-aiplatform.googleapis.com", "vertex"),
                           ("res.openai.azure.com", "azure-openai"),
                           ("bedrock-runtime.eu-west-1.amazonaws.com", "bedrock"),
                           ("api.mistral.ai", "mistral"), ("api.deepseek.com", "deepseek"),
                           ("api.groq.com", "groq"), ("api.together.xyz", "together"),
                           ("api.fireworks.ai", "fireworks"), ("openrouter.ai", "openrouter"),
                           ("api.x.ai", "xai"), ("api.cohere.com", "cohere"),
                           ("api.venice.ai", "venice")]:
        entry = known.find(host)
        assert entry is not None and entry.provider == provider, host
    for other in ["a.b.openai.azure.com", "openai.azure.com", "example.com",
                  "bedrock.us-east-1.amazonaws.com", "api.openai.com.evil.example"]:
        assert known.find(other) is None, other


def test_the_list_is_extended_and_overridden_in_the_settings_file(tmp_path: Path) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text("known_llm_hosts:\n"
                      "  extra:\n"
                      "    llm.corp.example: {provider: corp, protocol: openai}\n"
                      "    api.anthropic.com: {provider: anthropic, protocol: openai}\n"
                      "  remove: [openrouter.ai]\n")
    change = load_settings({}, str(config)).known_llm_hosts
    known = KnownHosts.packaged().changed(change)
    corp = known.find("llm.corp.example")
    assert corp is not None and (corp.provider, corp.protocol) == ("corp", "openai")
    anthropic = known.find("api.anthropic.com")
    assert anthropic is not None and anthropic.protocol == "openai"  # replaced
    assert known.find("openrouter.ai") is None
    for bad, problem in [({"remove": ["nope.example"]}, "not in the packaged list"),
                         ({"extra": {"*.com": {"protocol": "openai"}}}, "last two labels"),
                         ({"extra": {"x.example": {"protocol": "smtp"}}}, "protocol"),
                         ({"extra": {"a b.example": {"protocol": "openai"}}}, "host name"),
                         ({"only": []}, "'extra'")]:
        with pytest.raises(ValueError, match=problem):
            parse_change(bad)
    config.write_text("known_llm_hosts: {remove: [nope.example]}\n")
    with pytest.raises(ConfigError, match="known_llm_hosts: 'remove'"):
        load_settings({}, str(config))
    assert KnownHostsChange() == load_settings({}).known_llm_hosts


def test_tunnel_host_labels_are_host_names_and_bounded() -> None:
    labels = HostLabels(limit=3)
    assert [labels.label(host) for host in ["a.example", "B.example.", "a.example"]] == [
        "a.example", "b.example", "a.example"]
    assert labels.label("c.example") == "c.example"
    assert labels.label("d.example") == "other"  # the fourth host: past the bound
    assert labels.label("a.example") == "a.example"
    assert labels.label('x"} 1\nevil{') == "invalid"
    assert hostname("10.0.0.1") == "10.0.0.1" and hostname("[::1]") == "::1"
    assert hostname("é.example") is None and hostname("a" * 64 + ".example") is None
