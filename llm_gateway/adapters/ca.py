"""The sidecar's certificate authority, and the CA bundle that apps trust.

The CA lives in ``--ca-dir``. It is read from there when present, in either layout:

* ``tls.crt`` + ``tls.key``: a ``kubernetes.io/tls`` Secret (what cert-manager and
  ``kubectl create secret tls`` write), usually mounted read-only;
* ``mitmproxy-ca.pem``: mitmproxy's own file (private key and certificate in one PEM).

When the directory holds neither, a new CA is created there as ``tls.crt`` + ``tls.key``
(the key with mode 0600, written atomically, never logged and never served), so an
operator can turn it into a Secret as it is.

mitmproxy reads its CA from its ``confdir`` and writes into it, so it never gets the CA
directory itself: ``install_for_mitmproxy`` puts a copy into a private runtime directory.
"""

from __future__ import annotations

import hashlib
import logging
import os
import ssl
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from llm_gateway.config import ConfigError

log = logging.getLogger("llm_gateway.ca")

CERT_FILE = "tls.crt"
KEY_FILE = "tls.key"
MITMPROXY_CA_FILE = "mitmproxy-ca.pem"  # mitmproxy's name for key + certificate
CA_COMMON_NAME = "llm-gateway sidecar CA"
CA_ORGANIZATION = "llm-gateway"
CA_KEY_BITS = 2048

PrivateKey = rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey


@dataclass(frozen=True)
class GatewayCa:
    """The CA certificate (public) and its private key (never in a repr or a log line)."""

    cert_pem: bytes  # the CA certificate first, then the chain above it, if any
    key_pem: bytes = field(repr=False)
    source: str  # where it came from, for the start-up log line

    @property
    def fingerprint(self) -> str:
        der = x509.load_pem_x509_certificate(self.cert_pem).public_bytes(
            serialization.Encoding.DER
        )
        return hashlib.sha256(der).hexdigest()


def load_or_create_ca(ca_dir: Path | None) -> GatewayCa:
    """The CA in ``ca_dir``, created there first if it holds none.

    Without a directory the CA is made in memory: it lasts as long as the process, which
    suits a laptop or a test, not a pod whose apps read the bundle once.
    """
    if ca_dir is None:
        return _new_ca("a new in-memory CA (no --ca-dir)")
    cert_path, key_path = ca_dir / CERT_FILE, ca_dir / KEY_FILE
    if cert_path.exists() or key_path.exists():
        if not (cert_path.exists() and key_path.exists()):
            raise ConfigError("--ca-dir", f"{ca_dir} holds only one of {CERT_FILE}, {KEY_FILE}")
        return _checked(_read(cert_path), _read(key_path), str(ca_dir))
    combined_path = ca_dir / MITMPROXY_CA_FILE
    if combined_path.exists():
        combined = _read(combined_path)
        return _checked(combined, combined, str(combined_path))
    ca = _new_ca(f"a new CA in {ca_dir}")
    try:
        ca_dir.mkdir(parents=True, exist_ok=True)
        # The key first: a certificate without its key would stop the next start.
        _write_atomically(key_path, ca.key_pem, mode=0o600)
        _write_atomically(cert_path, ca.cert_pem, mode=0o644)
    except OSError as exc:
        raise ConfigError(
            "--ca-dir", f"{ca_dir} holds no CA and one cannot be created there: {exc.strerror}"
        ) from None
    return ca


def install_for_mitmproxy(ca: GatewayCa, confdir: Path) -> None:
    """Give mitmproxy the CA in ``confdir`` (its file names, key mode 0600)."""
    from mitmproxy.certs import DEFAULT_DHPARAM

    confdir.mkdir(mode=0o700, parents=True, exist_ok=True)
    _write_atomically(confdir / MITMPROXY_CA_FILE, ca.key_pem + ca.cert_pem, mode=0o600)
    # mitmproxy writes this file when it is missing; written here so it never has to.
    _write_atomically(confdir / "mitmproxy-dhparam.pem", DEFAULT_DHPARAM, mode=0o644)


def system_trust_store() -> Path:
    """The system's PEM bundle of public roots (certifi's when the system has none)."""
    paths = ssl.get_default_verify_paths()
    for candidate in (paths.cafile, paths.openssl_cafile):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    import certifi

    return Path(certifi.where())


def write_ca_bundle(ca: GatewayCa, out: Path, system_bundle: Path | None = None) -> None:
    """Write the public roots plus the gateway CA to ``out``, atomically.

    Apps point SSL_CERT_FILE (which replaces a client's roots, hence the public ones),
    REQUESTS_CA_BUNDLE and NODE_EXTRA_CA_CERTS at it. Readiness waits for this file, so it
    appears complete or not at all.
    """
    roots = (system_bundle or system_trust_store()).read_bytes()
    if not roots.endswith(b"\n"):
        roots += b"\n"
    bundle = roots + b"# llm-gateway sidecar CA\n" + ca.cert_pem
    out.parent.mkdir(parents=True, exist_ok=True)
    _write_atomically(out, bundle, mode=0o644)


# ---- internals ------------------------------------------------------------------------


def _new_ca(source: str) -> GatewayCa:
    from mitmproxy.certs import create_ca

    key, cert = create_ca(organization=CA_ORGANIZATION, cn=CA_COMMON_NAME, key_size=CA_KEY_BITS)
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )
    return GatewayCa(cert.public_bytes(serialization.Encoding.PEM), key_pem, source)


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError("--ca-dir", f"cannot read {path}: {exc.strerror}") from None


def _checked(cert_source: bytes, key_source: bytes, source: str) -> GatewayCa:
    """The CA certificate (with the chain that follows it, if any) and its key, after
    checking that they make a usable CA."""
    try:
        chain = x509.load_pem_x509_certificates(cert_source)
        cert = chain[0]
        key = serialization.load_pem_private_key(_first_key_block(key_source), password=None)
    except (ValueError, TypeError, IndexError):
        # Never the exception's text: it could quote key material.
        raise ConfigError("--ca-dir", f"{source}: not a PEM certificate and private key") from None
    if not isinstance(key, rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey):
        raise ConfigError("--ca-dir", f"{source}: the key must be RSA or EC")
    if key.public_key().public_numbers() != cert.public_key().public_numbers():
        raise ConfigError("--ca-dir", f"{source}: the private key does not match the certificate")
    try:
        constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        constraints = None
    if constraints is None or not constraints.ca:
        raise ConfigError("--ca-dir", f"{source}: the certificate is not a CA (basicConstraints)")
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )
    # An intermediate CA keeps its chain: mitmproxy serves it, and apps get it in the bundle.
    chain_pem = b"".join(c.public_bytes(serialization.Encoding.PEM) for c in chain)
    return GatewayCa(chain_pem, key_pem, source)


def _first_key_block(pem: bytes) -> bytes:
    """The PEM private-key block of a file that may also hold certificates."""
    start = pem.find(b"-----BEGIN ")
    while start != -1:
        header_end = pem.find(b"-----", start + 11)
        label = pem[start + 11:header_end]
        end_marker = b"-----END " + label + b"-----"
        end = pem.find(end_marker, header_end)
        if end == -1:
            break
        if label.endswith(b"PRIVATE KEY"):
            return pem[start:end + len(end_marker)]
        start = pem.find(b"-----BEGIN ", end)
    raise ValueError("no private key block")


def _write_atomically(path: Path, data: bytes, *, mode: int) -> None:
    """Write via a temporary file in the same directory and rename: readers see the old
    file or the whole new one. The mode is set at creation, so a key is never readable."""
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(descriptor, mode)
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
