from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from llm_gateway.config import ConfigError, Settings, load_settings
from tests.support import BIN


def test_defaults() -> None:
    settings = load_settings({})
    assert settings == Settings()
    assert (settings.bind_host, settings.bind_port) == ("127.0.0.1", 3000)
    assert settings.database_url == "sqlite:///./llm-gateway.db"
    assert settings.venice_base_url == "https://api.venice.ai/api/v1"
    assert settings.request_timeout_seconds == 120 and settings.venice_max_retries == 2
    assert settings.request_body_limit_bytes == 1048576
    assert settings.capture_genai_content is False and settings.redis_url is None


def test_environment_wins_over_yaml(tmp_path: Path) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text("venice_max_retries: 5\nrequest_timeout_seconds: 30\n"
                      "allowed_endpoints: ['POST /chat/completions']\n")
    settings = load_settings({"VENICE_MAX_RETRIES": "1", "LLM_GATEWAY_CONFIG": str(config)})
    assert settings.venice_max_retries == 1
    assert settings.request_timeout_seconds == 30
    assert settings.allowed_endpoints == ("POST /chat/completions",)


def test_provider_key_is_hidden_in_repr() -> None:
    settings = load_settings({"VENICE_API_KEY": "sk-very-secret"})
    assert "sk-very-secret" not in repr(settings)
    assert settings.require_provider_key().reveal() == "sk-very-secret"


@pytest.mark.parametrize(("variable", "value"), [
    ("BIND_ADDR", "nonsense"),
    ("BIND_ADDR", "127.0.0.1:99999"),
    ("DATABASE_URL", "mysql://x"),
    ("REDIS_URL", "http://x"),
    ("REDIS_URL", "unix://"),
    ("REDIS_URL", "redis:///0"),
    ("VENICE_BASE_URL", "api.venice.ai"),
    ("REQUEST_TIMEOUT_SECONDS", "0"),
    ("REQUEST_BODY_LIMIT_BYTES", "-1"),
    ("VENICE_MAX_RETRIES", "many"),
    ("CAPTURE_GENAI_CONTENT", "maybe"),
    ("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318"),
    ("LIMIT_LEASE_SECONDS", "-1"),
    ("LIMIT_LEASE_SECONDS", "soon"),
])
def test_bad_value_names_the_variable(variable: str, value: str) -> None:
    with pytest.raises(ConfigError) as raised:
        load_settings({variable: value})
    assert raised.value.variable == variable


def test_bad_value_stops_start_up_with_one_line_and_status_2(tmp_path: Path) -> None:
    env = {**os.environ, "VENICE_API_KEY": "k", "REQUEST_TIMEOUT_SECONDS": "soon",
           "DATABASE_URL": f"sqlite:///{tmp_path / 'x.db'}"}
    result = subprocess.run([str(BIN / "llm-gateway"), "serve"], env=env, capture_output=True,
                            text=True, timeout=30)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "llm-gateway: REQUEST_TIMEOUT_SECONDS: expected a number of seconds, got 'soon'"
    )


@pytest.mark.parametrize("command", ["serve", "sidecar"])
def test_with_json_logs_the_one_line_is_json_too(tmp_path: Path, command: str) -> None:
    """A log pipeline that reads JSON gets the reason a process would not start as JSON."""
    env = {**os.environ, "VENICE_API_KEY": "k", "RATE_LIMIT_FAILURE_POLICY": "bogus",
           "LOG_FORMAT": "json", "DATABASE_URL": f"sqlite:///{tmp_path / 'x.db'}"}
    result = subprocess.run([str(BIN / "llm-gateway"), command], env=env, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    line = json.loads(lines[0])
    assert line["level"] == "error" and line["logger"] == "llm_gateway"
    assert line["message"] == ("cannot start: RATE_LIMIT_FAILURE_POLICY: expected fail-open "
                               "or fail-closed, got 'bogus'")


def test_example_config_file_loads() -> None:
    from tests.support import REPO

    settings = load_settings({}, str(REPO / "config" / "gateway.example.yaml"))
    assert settings.allowed_endpoints == (
        "POST /chat/completions", "POST /embeddings", "GET /models"
    )


def test_unknown_setting_in_the_file_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text("venice_max_retrys: 5\n")
    with pytest.raises(ConfigError) as raised:
        load_settings({}, str(config))
    assert "unknown setting 'venice_max_retrys'" in str(raised.value)
