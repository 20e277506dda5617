"""Callers with a JWT: a token signed by a JWKS the test serves over HTTP is admitted on
/v1/chat/completions as its subject; expired, wrong audience, wrong issuer, ``alg: none``
and HS256 tokens get 401; keys are fetched once, cached, and fetched again for an unknown
key id (rotation), at most every so often."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from llm_gateway.auth_jwt import JWKS_MIN_REFRESH_SECONDS, JwtVerifier, jwt_verifier
from llm_gateway.config import ConfigError, Settings, load_settings
from llm_gateway.errors import Rejection
from llm_gateway.keys import KeyRecord, looks_like_jwt

ISSUER = "https://idp.example.test/"
AUDIENCE = "llm-gateway"


class Jwks:
    """A JWKS endpoint on a real socket; ``keys`` may be changed while it runs."""

    def __init__(self) -> None:
        self.keys: list[dict[str, Any]] = []
        self.fetches = 0
        self.up = True
        jwks = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                jwks.fetches += 1
                body = json.dumps({"keys": jwks.keys}).encode()
                self.send_response(200 if jwks.up else 503)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/.well-known/jwks.json"

    def add(self, private_key: Any, kid: str, alg: str) -> None:
        public = json.loads(jwt.algorithms.get_default_algorithms()[alg].to_jwk(
            private_key.public_key()))
        self.keys.append({**public, "kid": kid, "alg": alg, "use": "sig"})


@pytest.fixture(scope="module")
def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture(scope="module")
def ec_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


@pytest.fixture
def jwks(rsa_key: rsa.RSAPrivateKey, ec_key: ec.EllipticCurvePrivateKey) -> Iterator[Jwks]:
    served = Jwks()
    served.add(rsa_key, "rsa-1", "RS256")
    served.add(ec_key, "ec-1", "ES256")
    thread = threading.Thread(target=served.server.serve_forever, daemon=True)
    thread.start()
    yield served
    served.server.shutdown()
    served.server.server_close()


def claims(**overrides: Any) -> dict[str, Any]:
    now = int(time.time())
    return {"iss": ISSUER, "aud": AUDIENCE, "sub": "alice@example.test", "iat": now,
            "nbf": now, "exp": now + 300, "models": ["llama-3.3-70b"], **overrides}


def sign(key: Any, kid: str, alg: str = "RS256", **overrides: Any) -> str:
    return jwt.encode(claims(**overrides), key, algorithm=alg, headers={"kid": kid})


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def unsigned(**overrides: Any) -> str:
    """``alg: none``: no signature at all."""
    header = b64(json.dumps({"alg": "none", "typ": "JWT", "kid": "rsa-1"}).encode())
    return f"{header}.{b64(json.dumps(claims(**overrides)).encode())}."


def hs256(secret: bytes, kid: str = "rsa-1") -> str:
    """HMAC-signed, e.g. with the RSA public key's PEM as the secret (the classic confusion
    of a public key for a shared secret)."""
    header = b64(json.dumps({"alg": "HS256", "typ": "JWT", "kid": kid}).encode())
    body = f"{header}.{b64(json.dumps(claims()).encode())}"
    return f"{body}.{b64(hmac.new(secret, body.encode(), hashlib.sha256).digest())}"


def jwt_settings(jwks_url: str, **extra: str) -> dict[str, Any]:
    return {"jwt_jwks_url": jwks_url, "jwt_issuer": ISSUER, "jwt_audience": AUDIENCE,
            "jwt_models_claim": "models", **extra}


@pytest.fixture
def jwt_gw(start_gateway: Any, jwks: Jwks) -> Any:
    running = start_gateway(**jwt_settings(jwks.url))
    if running.gateway.auth.jwt is None:  # wiring builds it from the settings
        running.gateway.auth.jwt = jwt_verifier(running.gateway.settings)
    return running


def call(url: str, token: str, model: str = "llama-3.3-70b") -> httpx.Response:
    return httpx.post(url + "/v1/chat/completions", headers={"authorization": f"Bearer {token}"},
                      json={"model": model, "messages": [{"role": "user", "content": "hi"}]},
                      timeout=10)


def test_a_token_signed_by_the_jwks_is_admitted_as_its_subject(
    jwt_gw: Any, jwks: Jwks, rsa_key: Any, ec_key: Any, fake: Any
) -> None:
    tokens = [sign(key, kid, alg) for key, kid, alg in (
        (rsa_key, "rsa-1", "RS256"), (ec_key, "ec-1", "ES256"))]
    for token in tokens:
        response = call(jwt_gw.url, token)
        assert response.status_code == 200, response.text
        assert response.headers["x-ratelimit-limit-requests"] == "60"  # the default limit
    records = jwt_gw.finished.wait_for(2)
    assert [r.subject_id for r in records] == ["alice@example.test"] * 2
    assert jwks.fetches == 1  # fetched once, then cached
    # The models claim is the allowlist.
    refused = call(jwt_gw.url, sign(rsa_key, "rsa-1"), model="other-model")
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "model_not_allowed"
    # The caller's token never reaches the provider: the server-held key replaces it.
    assert fake.requests and all(
        token not in str(seen.headers) for seen in fake.requests for token in tokens)


@pytest.mark.parametrize(("make", "message"), [
    (lambda k: sign(k, "rsa-1", exp=int(time.time()) - 120), "expired"),
    (lambda k: sign(k, "rsa-1", aud="another-service"), "audience"),
    (lambda k: sign(k, "rsa-1", iss="https://evil.example.test/"), "issuer"),
    (lambda k: sign(k, "rsa-1", nbf=int(time.time()) + 600), "not valid yet"),
    (lambda k: unsigned(), "'none' is not accepted"),
    (lambda k: hs256(b"a shared secret"), "'HS256' is not accepted"),
    (lambda k: hs256(k.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)),
     "'HS256' is not accepted"),
    (lambda k: sign(k, "rsa-1")[:-4] + "AAAA", "signature"),
    (lambda k: sign(k, "rsa-1", models="   "), "names no models"),
    (lambda k: jwt.encode({k_: v for k_, v in claims().items() if k_ != "exp"}, k,
                          algorithm="RS256", headers={"kid": "rsa-1"}), "'exp' claim"),
])
def test_bad_tokens_get_401(jwt_gw: Any, rsa_key: Any, make: Any, message: str) -> None:
    response = call(jwt_gw.url, make(rsa_key))
    assert response.status_code == 401, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_api_key" and message in error["message"], error


def test_a_rotated_key_is_fetched_once_and_unknown_kids_do_not_hammer_the_idp(
    jwt_gw: Any, jwks: Jwks
) -> None:
    assert call(jwt_gw.url, sign(_new_rsa(), "nobody")).status_code == 401
    assert jwks.fetches == 1
    rotated = _new_rsa()
    jwks.add(rotated, "rsa-2", "RS256")
    # Within the minimum interval an unknown kid does not fetch again...
    assert call(jwt_gw.url, sign(rotated, "rsa-2")).status_code == 401
    assert jwks.fetches == 1
    # ...after it, the new key is fetched (once) and admitted.
    verifier = jwt_gw.gateway.auth.jwt
    verifier._earliest -= JWKS_MIN_REFRESH_SECONDS  # as if the interval had passed
    assert call(jwt_gw.url, sign(rotated, "rsa-2")).status_code == 200
    for _ in range(5):
        assert call(jwt_gw.url, sign(_new_rsa(), "forged")).status_code == 401
    assert jwks.fetches == 2


def _new_rsa() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


async def test_an_unreachable_jwks_is_503_then_recovers(jwks: Jwks, rsa_key: Any) -> None:
    clock = [1000.0]
    verifier = JwtVerifier(issuer=ISSUER, audience=AUDIENCE, jwks_url=jwks.url,
                           models_claim="models", clock=lambda: clock[0])
    jwks.up = False
    token = sign(rsa_key, "rsa-1")
    refused = await verifier.authenticate(token)
    assert isinstance(refused, Rejection) and refused.code == "key_store_unavailable"
    await verifier.authenticate(token)  # retried no sooner than a second later
    assert jwks.fetches == 1
    jwks.up, clock[0] = True, clock[0] + 1.5
    admitted = await verifier.authenticate(token)
    assert isinstance(admitted, KeyRecord) and admitted.subject_id == "alice@example.test"
    assert admitted.id == "subject:alice@example.test" and admitted.prefix == ""
    assert admitted.allowed_models == ("llama-3.3-70b",)


async def test_a_pem_public_key_from_a_file(tmp_path: Path, ec_key: Any) -> None:
    pem = tmp_path / "idp.pem"
    pem.write_bytes(ec_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    settings = load_settings({"JWT_PUBLIC_KEY": str(pem), "JWT_ISSUER": ISSUER,
                              "JWT_AUDIENCE": AUDIENCE, "JWT_SUBJECT_CLAIM": "email"})
    verifier = jwt_verifier(settings)
    assert verifier is not None
    token = jwt.encode(claims(email="bob@example.test"), ec_key, algorithm="ES256")
    admitted = await verifier.authenticate(token)
    assert isinstance(admitted, KeyRecord) and admitted.subject_id == "bob@example.test"
    assert admitted.allowed_models == ()  # no models claim configured: every model
    # An RS256 token cannot pass for this EC key.
    wrong = await verifier.authenticate(jwt.encode(claims(), _new_rsa(), algorithm="RS256"))
    assert isinstance(wrong, Rejection) and b"does not match" in wrong.body


def test_settings_refuse_a_half_configured_verifier(tmp_path: Path) -> None:
    assert jwt_verifier(Settings()) is None
    for settings, variable in (
        (Settings(jwt_jwks_url="http://idp/jwks", jwt_issuer=ISSUER), "JWT_AUDIENCE"),
        (Settings(jwt_jwks_url="http://idp/jwks", jwt_audience=AUDIENCE), "JWT_ISSUER"),
        (Settings(jwt_jwks_url="http://idp/jwks", jwt_public_key="x", jwt_issuer=ISSUER,
                  jwt_audience=AUDIENCE), "JWT_PUBLIC_KEY"),
        (Settings(jwt_public_key=str(tmp_path / "missing.pem"), jwt_issuer=ISSUER,
                  jwt_audience=AUDIENCE), "JWT_PUBLIC_KEY"),
    ):
        with pytest.raises(ConfigError) as raised:
            jwt_verifier(settings)
        assert raised.value.variable == variable


def test_jwts_are_told_apart_from_keys_by_shape() -> None:
    assert looks_like_jwt("eyJh.eyJz.c2ln") and looks_like_jwt("eyJh.eyJz.")
    assert not looks_like_jwt("llmg_" + "a" * 38)
    assert not looks_like_jwt("llmga_" + "a" * 38)
    assert not looks_like_jwt("a.b") and not looks_like_jwt("a.b.c.d")
