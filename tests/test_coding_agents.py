"""The real coding agents, from npm, complete a prompt through the gateway: Claude Code
(``claude -p``, Anthropic Messages) and Codex (``codex exec``, OpenAI Responses), each through
``serve`` and through the regular-mode sidecar; and each on a model whose only target is a
Venice-like chat provider (their requests translated), Claude Code through a turn that calls
a tool. Every request an agent made is one usage
record, matched against what the fake provider answered: its message or response id, its
tokens.

* ``serve``: the agent's base URL is the gateway's, its key the gateway key; every other
  connection it tries goes to a proxy that refuses it and notes it (there must be none).
* the regular sidecar: the agent calls the provider's own URL (the fake, over HTTPS with a
  certificate made now) through ``HTTPS_PROXY``, trusting the sidecar's CA bundle; it holds
  the gateway key only; the sidecar refuses every other host (``EGRESS_POLICY=deny``) and
  there must be no such refusal.

The agents are installed once per machine (tests/coding_agents.py); without npm's registry
the suite skips, or fails in CI.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import ssl
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from llm_gateway.billing.metering import UsageRecord
from llm_gateway.testing.fake_content import TOOL_CALL_HEADER
from llm_gateway.testing.fake_exchange import RecordedRequest
from llm_gateway.testing.fake_upstream import FakeUpstream, fake_reply_text, running_fake_upstream
from tests.agent_support import CLAUDE, GPT, PROVIDER_KEY, agent_routes
from tests.coding_agents import (
    CodingAgents,
    claude_environment,
    codex_environment,
    coding_agents,
    refusing_proxy,
    run_agent,
)
from tests.support import (
    BIN,
    create_key,
    free_port,
    fresh_database_url,
    self_signed_certificate,
    usage_records,
)
from tests.test_sidecar import running_process

pytestmark = pytest.mark.slow_once

PROMPT = "Say hello"
OPEN_MODEL = "llama-3.3-70b"  # the Venice-like fake's model
REPLY = fake_reply_text(8)  # the fakes' default: 8 chunks


@pytest.fixture(scope="session")
def agents() -> CodingAgents:
    return coding_agents()


# ---- the gateway in front of the fakes ---------------------------------------------------


@dataclass
class Deployment:
    kind: str  # "serve" or "sidecar"
    claude: FakeUpstream
    claude_url: str  # the provider's API root: .../v1
    gpt: FakeUpstream
    gpt_url: str  # .../api/v1
    open_model: FakeUpstream  # the Venice-like chat provider of the alias ``open``
    database_url: str
    key: str
    key_id: str
    log: Path
    url: str | None = None  # serve: the gateway's base URL
    proxy: str | None = None  # sidecar: http://127.0.0.1:PORT
    ca_bundle: Path | None = None  # sidecar: what apps trust

    @property
    def adapter(self) -> str:
        return "asgi" if self.kind == "serve" else "sidecar"

    def events(self) -> list[dict[str, Any]]:
        """The access log's lines (one per request, or per refused request or tunnel)."""
        found = []
        for line in self.log.read_text().splitlines():
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    event = json.loads(line)
                    if isinstance(event, dict) and "event" in event:
                        found.append(event)
        return found


def _provider_trust(certificate: Path, directory: Path) -> dict[str, str]:
    """The environment that makes the gateway trust the fake provider's certificate beside the
    system's roots. SSL_CERT_DIR (a hashed directory) rather than SSL_CERT_FILE: the sidecar's
    CA bundle for apps is written from the system's CA file, which SSL_CERT_FILE would
    replace, and the apps would then trust the fake's certificate directly."""
    openssl = shutil.which("openssl")
    if openssl is None:
        return {"SSL_CERT_FILE": str(certificate)}
    subject_hash = subprocess.run([openssl, "x509", "-hash", "-noout", "-in", str(certificate)],
                                  capture_output=True, text=True, check=True).stdout.strip()
    trusted = directory / "provider-trust"
    trusted.mkdir()
    shutil.copy(certificate, trusted / f"{subject_hash}.0")
    return {"SSL_CERT_DIR": str(trusted)}


@contextlib.contextmanager
def deployed(kind: str, directory: Path) -> Iterator[Deployment]:
    """The two fakes (over HTTPS for the sidecar, as a provider is reached) and ``serve``
    or a regular-mode ``sidecar`` in front of them, as processes, with routes
    (tests/agent_support.py) from a YAML file given with ``--config``: aliases ``claude``
    (the anthropic fake) and ``gpt`` (the openai fake)."""
    tls = None
    if kind == "sidecar":
        certificate, private_key, _ = self_signed_certificate(directory)
        tls = (certificate, private_key)
    with running_fake_upstream(FakeUpstream(PROVIDER_KEY, usage_mode="anthropic"),
                               tls=tls) as (claude, claude_url), \
            running_fake_upstream(FakeUpstream(PROVIDER_KEY, usage_mode="openai"),
                                  tls=tls) as (gpt, gpt_url), \
            running_fake_upstream(FakeUpstream(PROVIDER_KEY, usage_mode="venice"),
                                  tls=tls) as (open_model, open_url):
        config = directory / "gateway.yaml"
        routes = agent_routes(claude_url, gpt_url)
        # ``open``: a Venice-like chat provider only (strict top-level fields): the agents'
        # requests reach it translated.
        routes["providers"]["venice"] = {"base_url": open_url, "profile": "venice",
                                         "api_key_env": "AGENT_TEST_KEY"}
        routes["models"]["open"] = {"targets": [{"provider": "venice", "model": OPEN_MODEL}]}
        config.write_text(yaml.safe_dump(routes))
        database_url = fresh_database_url(directory)
        record, key = create_key(database_url, rate_limit_requests=1000)
        env = {"DATABASE_URL": database_url, "AGENT_TEST_KEY": PROVIDER_KEY,
               "USAGE_SPOOL_DIR": str(directory / "spool")}
        log = directory / f"{kind}.log"
        port = free_port()
        common = dict(claude=claude, claude_url=claude_url, gpt=gpt, gpt_url=gpt_url,
                      open_model=open_model,
                      database_url=database_url, key=key, key_id=record.id, log=log)
        if kind == "serve":
            url = f"http://127.0.0.1:{port}"
            env |= {"BIND_ADDR": f"127.0.0.1:{port}", "ADMIN_BIND_ADDR": "off"}
            command = [str(BIN / "llm-gateway"), "--config", str(config), "serve"]
            with running_process(command, env, log, url + "/healthz"):
                yield Deployment(kind, url=url, **common)  # type: ignore[arg-type]
        else:
            assert tls is not None
            admin = f"127.0.0.1:{free_port()}"
            bundle = directory / "bundle" / "ca-bundle.pem"
            env |= {"EGRESS_POLICY": "deny", **_provider_trust(tls[0], directory)}
            command = [str(BIN / "llm-gateway"), "--config", str(config), "sidecar",
                       "--listen", f"127.0.0.1:{port}", "--admin", admin,
                       "--ca-dir", str(directory / "ca"), "--ca-bundle-out", str(bundle)]
            with running_process(command, env, log, f"http://{admin}/readyz"):
                if "SSL_CERT_DIR" in env:  # the apps trust the sidecar, not the provider
                    assert tls[0].read_text().strip() not in bundle.read_text()
                yield Deployment(kind, proxy=f"http://127.0.0.1:{port}", ca_bundle=bundle,
                                 **common)  # type: ignore[arg-type]


# ---- what the fakes answered, and the records that must match it ------------------------


def sse_data(seen: RecordedRequest) -> list[dict[str, Any]]:
    """The JSON of every ``data:`` line the fake streamed back."""
    found = []
    for line in bytes(seen.sent).decode().splitlines():
        if line.startswith("data:") and line[5:].strip() not in ("", "[DONE]"):
            found.append(json.loads(line[5:]))
    return found


def expected_from_messages(seen: RecordedRequest) -> dict[str, Any]:
    """What the record of one streamed Messages request says, from the events the fake sent:
    every input token in prompt_tokens (Anthropic's input_tokens leaves the cached out)."""
    events = sse_data(seen)
    message = next(e for e in events if e["type"] == "message_start")["message"]
    usage = {**message["usage"], **[e for e in events if e["type"] == "message_delta"][-1]["usage"]}
    read, written = usage["cache_read_input_tokens"], usage["cache_creation_input_tokens"]
    prompt = usage["input_tokens"] + read + written
    return {"response_id": message["id"], "prompt_tokens": prompt,
            "completion_tokens": usage["output_tokens"],
            "total_tokens": prompt + usage["output_tokens"], "cache_read_tokens": read,
            "cache_write_tokens": written, "upstream_model": seen.json["model"]}  # type: ignore[index]


def expected_from_responses(seen: RecordedRequest) -> dict[str, Any]:
    """What the record of one streamed Responses request says, from response.completed."""
    [done] = [e for e in sse_data(seen) if e["type"] == "response.completed"]
    response, usage = done["response"], done["response"]["usage"]
    return {"response_id": response["id"], "prompt_tokens": usage["input_tokens"],
            "completion_tokens": usage["output_tokens"], "total_tokens": usage["total_tokens"],
            "cache_read_tokens": usage["input_tokens_details"]["cached_tokens"],
            "reasoning_tokens": usage["output_tokens_details"]["reasoning_tokens"],
            "upstream_model": seen.json["model"]}  # type: ignore[index]


def assert_a_record_per_request(deployment: Deployment, fake: FakeUpstream, *, path: str,
                                protocol: str, alias: str, provider: str,
                                ignored_paths: tuple[str, ...] = ()) -> list[UsageRecord]:
    """One record per request the agent made, each as the fake answered it; the access log
    holds those requests and nothing refused (no other endpoint, no other host)."""
    assert fake.requests, "the agent's request never reached the provider"
    assert [seen.path for seen in fake.requests] == [path] * len(fake.requests)
    for seen in fake.requests:  # the provider saw its own key, never the gateway's
        assert deployment.key not in json.dumps(seen.headers) + seen.body.decode(errors="replace")
        assert PROVIDER_KEY in (seen.headers.get("x-api-key"),
                                seen.headers.get("authorization", "").removeprefix("Bearer "))
    expect = expected_from_messages if protocol == "messages" else expected_from_responses
    expected = {e["response_id"]: e for e in map(expect, fake.requests)}
    records = usage_records(deployment.database_url)
    assert sorted(r.response_id or "" for r in records) == sorted(expected), records
    for record in records:
        assert (record.status, record.error_code, record.protocol, record.endpoint) == \
            (200, None, protocol, protocol)
        assert (record.model, record.provider, record.adapter, record.key_id, record.stream,
                record.tokens_estimated) == \
            (alias, provider, deployment.adapter, deployment.key_id, True, False)
        wanted = expected[record.response_id or ""]
        assert {name: getattr(record, name) for name in wanted} == wanted
    events = deployment.events()
    requests = [e for e in events if e["event"] == "request"]
    assert sorted(e["request_id"] for e in requests) == sorted(r.request_id for r in records)
    refused = [e for e in events if e["event"] != "request"
               and e.get("path") not in ignored_paths]
    assert refused == [], f"the gateway refused some of the agent's requests: {refused}"
    return records


# ---- Claude Code -------------------------------------------------------------------------

# Claude Code asks these of api.anthropic.com when it is signed in there (the managed
# settings of an organisation); pointed at a gateway with a token, 2.1.332 asks neither of
# the gateway. What the gateway would answer: at once, a refusal in Anthropic's shape.
CLAUDE_CODE_SETTINGS = ("/api/claude_code/settings", "/api/claude_code/policy_limits")


def assert_claude_code_settings_refused_at_once(deployment: Deployment) -> None:
    if deployment.proxy is not None:
        assert deployment.ca_bundle is not None
        client = httpx.Client(proxy=deployment.proxy, timeout=10,
                              verify=ssl.create_default_context(cafile=str(deployment.ca_bundle)))
        base = deployment.claude_url.removesuffix("/v1")
    else:
        assert deployment.url is not None
        client, base = httpx.Client(timeout=10), deployment.url
    with client:
        for path in CLAUDE_CODE_SETTINGS:
            started = time.monotonic()
            answer = client.get(base + path, headers={
                "authorization": f"Bearer {deployment.key}", "user-agent": "claude-cli/2.1.332",
                "cache-control": "no-cache", "anthropic-beta": "oauth-2025-04-20"})
            assert time.monotonic() - started < 2
            body = answer.json()
            # serve: 404 not_found_error; the sidecar: 403 permission_error (a path outside
            # the provider's API root is never forwarded).
            assert (answer.status_code, body["type"], body["error"]["type"]) in (
                (404, "error", "not_found_error"), (403, "error", "permission_error")), body
            assert isinstance(body["error"]["message"], str)


def run_claude(agents: CodingAgents, deployment: Deployment, directory: Path, *,
               model: str = "claude", extra: dict[str, str] | None = None) -> None:
    home, work = directory / "claude-home", directory / "work"
    work.mkdir()
    if deployment.kind == "serve":
        assert deployment.url is not None
        with refusing_proxy() as elsewhere:
            env = claude_environment(home, base_url=deployment.url, key=deployment.key)
            env |= {"HTTPS_PROXY": elsewhere.url, "HTTP_PROXY": elsewhere.url,
                    "NO_PROXY": "127.0.0.1", **(extra or {})}
            run = run_agent([str(agents.claude), "-p", PROMPT, "--model", model], env, work)
        assert elsewhere.seen == [], f"Claude Code tried other hosts: {elsewhere.seen}"
    else:
        assert deployment.proxy is not None and deployment.ca_bundle is not None
        env = claude_environment(home, base_url=deployment.claude_url.removesuffix("/v1"),
                                 key=deployment.key)
        env |= {"HTTPS_PROXY": deployment.proxy, "HTTP_PROXY": deployment.proxy,
                "NODE_EXTRA_CA_CERTS": str(deployment.ca_bundle), **(extra or {})}
        run = run_agent([str(agents.claude), "-p", PROMPT, "--model", model], env, work)
    assert run.returncode == 0, run.describe()
    assert REPLY in run.stdout, run.describe()


@pytest.mark.parametrize("kind", ["serve", "sidecar"])
def test_claude_code_completes_a_prompt(agents: CodingAgents, tmp_path: Path, kind: str) -> None:
    with deployed(kind, tmp_path) as deployment:
        run_claude(agents, deployment, tmp_path)
        assert deployment.gpt.requests == []
        assert_claude_code_settings_refused_at_once(deployment)
    [seen] = deployment.claude.requests  # one turn, one request
    assert seen.query == "beta=true" and seen.json["stream"] is True  # type: ignore[index]
    assert seen.json["model"] == CLAUDE  # type: ignore[index]
    assert_a_record_per_request(deployment, deployment.claude, path="/v1/messages",
                                protocol="messages", alias="claude", provider="anthropic",
                                ignored_paths=CLAUDE_CODE_SETTINGS)


# ---- Codex -------------------------------------------------------------------------------


def run_codex(agents: CodingAgents, deployment: Deployment, directory: Path, *,
              model: str = "gpt") -> str:
    home, work = directory / "codex-home", directory / "work"
    work.mkdir()
    command = [str(agents.codex), "exec", "--skip-git-repo-check", PROMPT]
    if deployment.kind == "serve":
        assert deployment.url is not None
        with refusing_proxy() as elsewhere:
            env = codex_environment(home, base_url=deployment.url + "/v1", key=deployment.key,
                                    model=model)
            env |= {"HTTPS_PROXY": elsewhere.url, "HTTP_PROXY": elsewhere.url,
                    "NO_PROXY": "127.0.0.1"}
            run = run_agent(command, env, work)
        assert elsewhere.seen == [], f"Codex tried other hosts: {elsewhere.seen}"
    else:
        assert deployment.proxy is not None and deployment.ca_bundle is not None
        env = codex_environment(home, base_url=deployment.gpt_url, key=deployment.key,
                                model=model)
        env |= {"HTTPS_PROXY": deployment.proxy, "HTTP_PROXY": deployment.proxy,
                "SSL_CERT_FILE": str(deployment.ca_bundle)}
        run = run_agent(command, env, work)
    assert run.returncode == 0, run.describe()
    assert REPLY in run.stdout, run.describe()
    return run.stderr


@pytest.mark.parametrize("kind", ["serve", "sidecar"])
def test_codex_completes_a_prompt(agents: CodingAgents, tmp_path: Path, kind: str) -> None:
    with deployed(kind, tmp_path) as deployment:
        stderr = run_codex(agents, deployment, tmp_path)
        assert deployment.claude.requests == []
    [seen] = deployment.gpt.requests
    assert seen.json["stream"] is True and seen.json["model"] == GPT  # type: ignore[index]
    [record] = assert_a_record_per_request(deployment, deployment.gpt, path="/api/v1/responses",
                                           protocol="responses", alias="gpt", provider="openai")
    # What it prints as "tokens used" is response.completed's total, as recorded.
    assert f"tokens used\n{record.total_tokens:,}\n" in stderr


# ---- the agents on a chat-only model, translated -------------------------------------------


def assert_a_record_per_chat_request(deployment: Deployment, protocol: str) -> None:
    """One record per request the chat provider answered, with the usage its stream said
    (Venice sends a usage chunk in every stream), naming the alias and the provider."""
    fake = deployment.open_model
    assert fake.requests, "the agent's request never reached the chat provider"
    assert {seen.path for seen in fake.requests} == {"/api/v1/chat/completions"}
    usages = [[e for e in sse_data(seen) if e.get("usage")][-1]["usage"]
              for seen in fake.requests]
    records = usage_records(deployment.database_url)
    assert len(records) == len(fake.requests), records
    for record in records:
        assert (record.status, record.error_code, record.protocol, record.model,
                record.provider, record.upstream_model) == \
            (200, None, protocol, "open", "venice", OPEN_MODEL), record
    assert sorted((r.prompt_tokens, r.completion_tokens) for r in records) == \
        sorted((u["prompt_tokens"], u["completion_tokens"]) for u in usages)


def test_claude_code_on_a_chat_model_completes_a_prompt_and_a_tool_turn(
        agents: CodingAgents, tmp_path: Path) -> None:
    """Claude Code's Messages, translated to a Venice-like chat provider: a turn in which the
    model calls a tool (Read: read-only), Claude Code runs it and sends its result, and the
    model answers."""
    with deployed("serve", tmp_path) as deployment:
        run_claude(agents, deployment, tmp_path, model="open",
                   extra={"ANTHROPIC_CUSTOM_HEADERS": f"{TOOL_CALL_HEADER}: Read"})
        assert deployment.claude.requests == [] and deployment.gpt.requests == []
    bodies = [seen.json for seen in deployment.open_model.requests]
    assert any(m.get("role") == "tool" for body in bodies  # type: ignore[union-attr]
               for m in body["messages"]), "Claude Code never sent the tool's result back"
    assert_a_record_per_chat_request(deployment, "messages")


def test_codex_on_a_chat_model_completes_a_prompt(agents: CodingAgents, tmp_path: Path) -> None:
    with deployed("serve", tmp_path) as deployment:
        run_codex(agents, deployment, tmp_path, model="open")
        assert deployment.claude.requests == [] and deployment.gpt.requests == []
    assert_a_record_per_chat_request(deployment, "responses")
