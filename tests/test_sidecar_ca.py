"""The sidecar's CA, its bundle, its arguments, and the engine's interception settings."""

from __future__ import annotations

import datetime
import os
import subprocess
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from llm_gateway.adapters.ca import (
    CERT_FILE,
    KEY_FILE,
    MITMPROXY_CA_FILE,
    install_for_mitmproxy,
    load_or_create_ca,
    write_ca_bundle,
)
from llm_gateway.adapters.sidecar import parse_arguments
from llm_gateway.config import ConfigError, EgressPolicy, load_settings
from llm_gateway.wiring import build_gateway
from tests.conftest import make_settings
from tests.support import BIN


def snapshot(directory: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_mtime_ns, p.stat().st_mode) for p in directory.iterdir()}


def test_a_new_ca_is_created_once_with_a_private_key(tmp_path: Path) -> None:
    ca_dir = tmp_path / "ca"
    created = load_or_create_ca(ca_dir)
    assert (ca_dir / KEY_FILE).stat().st_mode & 0o777 == 0o600
    assert (ca_dir / CERT_FILE).read_bytes() == created.cert_pem
    assert "PRIVATE" not in repr(created)
    before = snapshot(ca_dir)
    again = load_or_create_ca(ca_dir)
    assert again.fingerprint == created.fingerprint
    assert snapshot(ca_dir) == before  # read, never rewritten: a mounted Secret is read-only
    certificate = x509.load_pem_x509_certificate(created.cert_pem)
    assert certificate.extensions.get_extension_for_class(x509.BasicConstraints).value.ca


def test_mitmproxy_gets_its_copy_elsewhere(tmp_path: Path) -> None:
    ca_dir = tmp_path / "secret"
    ca = load_or_create_ca(ca_dir)
    before = snapshot(ca_dir)
    confdir = tmp_path / "runtime"
    install_for_mitmproxy(ca, confdir)
    assert snapshot(ca_dir) == before
    assert (confdir / MITMPROXY_CA_FILE).stat().st_mode & 0o777 == 0o600
    assert (confdir / MITMPROXY_CA_FILE).read_bytes() == ca.key_pem + ca.cert_pem
    # mitmproxy-style directories are read as well.
    mitm_dir = tmp_path / "mitm"
    mitm_dir.mkdir()
    (mitm_dir / MITMPROXY_CA_FILE).write_bytes(ca.key_pem + ca.cert_pem)
    assert load_or_create_ca(mitm_dir).fingerprint == ca.fingerprint


def self_signed(is_ca: bool) -> tuple[bytes, bytes]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test")])
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
    )
    if is_ca:
        builder = builder.add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
    cert = builder.sign(key, hashes.SHA256())
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


@pytest.mark.parametrize("problem", ["not a CA", "key mismatch", "half a pair", "garbage"])
def test_an_unusable_ca_stops_start_up(tmp_path: Path, problem: str) -> None:
    cert_pem, key_pem = self_signed(is_ca=problem != "not a CA")
    if problem == "key mismatch":
        key_pem = self_signed(is_ca=True)[1]
    if problem == "garbage":
        cert_pem = b"-----BEGIN CERTIFICATE-----\nnope\n-----END CERTIFICATE-----\n"
    (tmp_path / CERT_FILE).write_bytes(cert_pem)
    if problem != "half a pair":
        (tmp_path / KEY_FILE).write_bytes(key_pem)
    with pytest.raises(ConfigError) as raised:
        load_or_create_ca(tmp_path)
    assert raised.value.variable == "--ca-dir"
    assert "PRIVATE" not in str(raised.value) and "nope" not in str(raised.value)


def test_an_ec_ca_from_a_tls_secret_is_used(tmp_path: Path) -> None:
    cert_pem, key_pem = self_signed(is_ca=True)
    (tmp_path / CERT_FILE).write_bytes(cert_pem)
    (tmp_path / KEY_FILE).write_bytes(key_pem)
    assert load_or_create_ca(tmp_path).cert_pem == cert_pem


def test_the_bundle_is_the_system_roots_plus_the_gateway_ca(tmp_path: Path) -> None:
    ca = load_or_create_ca(None)
    roots = tmp_path / "roots.pem"
    roots.write_bytes(b"-----BEGIN CERTIFICATE-----\nroot\n-----END CERTIFICATE-----")
    out = tmp_path / "shared" / "ca-bundle.pem"
    write_ca_bundle(ca, out, roots)
    bundle = out.read_bytes()
    assert bundle.startswith(roots.read_bytes() + b"\n") and bundle.endswith(ca.cert_pem)
    assert out.stat().st_mode & 0o777 == 0o644
    assert [p.name for p in out.parent.iterdir()] == ["ca-bundle.pem"]  # no temporary left


def test_arguments() -> None:
    arguments = parse_arguments([])
    assert (arguments.listen, arguments.admin, arguments.mode) == (
        ("127.0.0.1", 8080), ("127.0.0.1", 9090), "regular")
    arguments = parse_arguments(["--listen", "0.0.0.0:3128", "--admin", "[::1]:9000",
                                 "--mode", "reverse", "--ca-dir", "/ca"])
    assert arguments.listen == ("0.0.0.0", 3128) and arguments.admin == ("::1", 9000)
    assert arguments.mode == "reverse" and arguments.ca_dir == Path("/ca")
    for bad in (["--admin", "127.0.0.1:8080"], ["--listen", "nowhere"], ["--mode", "socks5"]):
        with pytest.raises(SystemExit):
            parse_arguments(bad)


def test_a_bad_ca_dir_exits_with_one_line(tmp_path: Path) -> None:
    (tmp_path / CERT_FILE).write_text("not a certificate")
    env = {**os.environ, "VENICE_API_KEY": "sk-x", "DATABASE_URL": f"sqlite:///{tmp_path}/g.db"}
    result = subprocess.run(
        [str(BIN / "llm-gateway"), "sidecar", "--ca-dir", str(tmp_path), "--listen",
         "127.0.0.1:0", "--admin", "127.0.0.1:1"],
        env=env, capture_output=True, text=True, timeout=30,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith("llm-gateway: --ca-dir:")


# ---- which hosts the engine intercepts, and the egress policy ----------------------------


def test_llm_hosts_and_egress_policy_settings(tmp_path: Path) -> None:
    settings = load_settings({"VENICE_BASE_URL": "http://127.0.0.1:3001/api/v1"})
    assert settings.egress_policy is EgressPolicy.ALLOW
    assert settings.llm_host_roots() == {"api.venice.ai": "/api/v1", "127.0.0.1:3001": "/api/v1"}
    config = tmp_path / "gateway.yaml"
    config.write_text("llm_hosts:\n  api.venice.ai: /api/v1\n  llm.internal:8443: /v2/\n"
                      "egress_policy: deny\n")
    settings = load_settings({}, str(config))
    assert settings.egress_policy is EgressPolicy.DENY
    assert settings.llm_host_roots() == {"api.venice.ai": "/api/v1", "llm.internal:8443": "/v2"}
    assert load_settings({"EGRESS_POLICY": "ALLOW"}, str(config)).egress_policy == "allow"
    with pytest.raises(ConfigError, match="EGRESS_POLICY"):
        load_settings({"EGRESS_POLICY": "maybe"})
    config.write_text("llm_hosts:\n  api.venice.ai: api/v1\n")
    with pytest.raises(ConfigError, match="llm_hosts"):
        load_settings({}, str(config))


def test_the_engine_maps_hosts_and_paths(tmp_path: Path) -> None:
    gateway = build_gateway(make_settings(tmp_path, "http://127.0.0.1:3001/api/v1"))
    assert gateway.api_root_for_host("API.Venice.ai.", 443) == "/api/v1"
    assert gateway.api_root_for_host("127.0.0.1", 3001) == "/api/v1"
    assert gateway.api_root_for_host("127.0.0.1", 3002) is None
    assert gateway.api_root_for_host("example.com", 443) is None
    assert gateway.path_under_root("/api/v1", "/api/v1/chat/completions") == "/chat/completions"
    assert gateway.path_under_root("/api/v1", "/api/v10/models") is None
    assert gateway.path_under_root("/api/v1", "/dashboard") is None
    assert gateway.egress_rejection("example.com", 443) is None
    denying = build_gateway(make_settings(tmp_path, "http://127.0.0.1:3001/api/v1",
                                    egress_policy=EgressPolicy.DENY))
    rejection = denying.egress_rejection("example.com", 443)
    assert rejection is not None and rejection.status == 403
    assert rejection.code == "egress_denied"


def test_an_intermediate_ca_keeps_its_chain(tmp_path: Path) -> None:
    from mitmproxy.certs import CertStore

    root_cert_pem, root_key_pem = self_signed(is_ca=True)
    root_cert = x509.load_pem_x509_certificate(root_cert_pem)
    root_key = serialization.load_pem_private_key(root_key_pem, None)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    intermediate = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sidecar CA")]))
        .issuer_name(root_cert.subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), True)
        .sign(root_key, hashes.SHA256())  # type: ignore[arg-type]
    )
    intermediate_pem = intermediate.public_bytes(serialization.Encoding.PEM)
    (tmp_path / CERT_FILE).write_bytes(intermediate_pem + root_cert_pem)
    (tmp_path / KEY_FILE).write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    ca = load_or_create_ca(tmp_path)
    assert ca.cert_pem == intermediate_pem + root_cert_pem
    confdir = tmp_path / "runtime"
    install_for_mitmproxy(ca, confdir)
    store = CertStore.from_store(confdir, "mitmproxy", 2048)
    assert [c.cn for c in store.default_chain_certs] == ["sidecar CA", "test"]
