"""Callers with a JWT from the organisation's identity provider, instead of a gateway key.

A bearer credential shaped like a JWT (three base64url segments) is verified by PyJWT,
never by hand: RS256 or ES256 only (``none`` and HMAC are refused, so a public key can
never be used as an HMAC secret), signature, ``exp`` and ``nbf`` with a small leeway,
issuer and audience. The signing keys come from ``JWT_PUBLIC_KEY`` (one PEM key, or a
path to one) or from ``JWT_JWKS_URL``: fetched with a timeout, cached, fetched again when
old, and at once (at most every ``JWKS_MIN_REFRESH_SECONDS``) when a token names a key
id the cache does not hold, which is how an identity provider's key rotation arrives.

The principal is a KeyRecord-shaped record for the engine: id ``subject:<sub>``, the
subject from ``JWT_SUBJECT_CLAIM``, allowed models from ``JWT_MODELS_CLAIM`` (a list or a
space-separated string) and the default rate limit; budgets then apply to the subject.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from llm_gateway import caller_text
from llm_gateway.config import ConfigError, Settings
from llm_gateway.errors import Rejection, invalid_api_key, key_store_unavailable
from llm_gateway.keys import KeyRecord, subject_principal

ALGORITHMS = ("RS256", "ES256")
SUBJECT_CHARS = 200  # what the admin API admits for a key's subject_id
LEEWAY_SECONDS = 30  # clock skew between the identity provider and this gateway
JWKS_TIMEOUT_SECONDS = 5.0
JWKS_MAX_AGE_SECONDS = 300.0
JWKS_MIN_REFRESH_SECONDS = 30.0
# With no keys at all (the first fetch failed), JWT callers get 503 until a fetch works:
# try again soon, but not on every request.
JWKS_RETRY_SECONDS = 1.0
log = logging.getLogger("llm_gateway.auth")

# PyJWT's errors, most specific first, as the one line the caller reads.
_MESSAGES: tuple[tuple[type[Exception], str], ...] = (
    (jwt.ExpiredSignatureError, "The JWT has expired."),
    (jwt.ImmatureSignatureError, "The JWT is not valid yet (nbf or iat in the future)."),
    (jwt.InvalidAudienceError, "The JWT's audience (aud) is not this gateway's."),
    (jwt.InvalidIssuerError, "The JWT's issuer (iss) is not the one this gateway trusts."),
    (jwt.InvalidAlgorithmError, "The JWT's algorithm does not match its signing key."),
    (jwt.InvalidSignatureError, "The JWT's signature does not verify."),
)


def _algorithm_of(key: Any) -> str:
    if isinstance(key, rsa.RSAPublicKey):
        return "RS256"
    if isinstance(key, ec.EllipticCurvePublicKey) and isinstance(key.curve, ec.SECP256R1):
        return "ES256"
    raise ValueError("expected an RSA or an EC P-256 public key")


class JwtVerifier:
    def __init__(
        self,
        *,
        issuer: str,
        audience: str,
        subject_claim: str = "sub",
        models_claim: str | None = None,
        jwks_url: str | None = None,
        public_key: Any = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.issuer = issuer
        self.audience = audience
        self.subject_claim = subject_claim
        self.models_claim = models_claim
        self.jwks_url = jwks_url
        self._clock = clock
        # kid -> (public key, algorithm); a PEM key has no kid: "".
        self._keys: dict[str, tuple[Any, str]] = (
            {"": (public_key, _algorithm_of(public_key))} if public_key is not None else {})
        self._refresh_due = 0.0  # fetch the JWKS again from then on
        self._earliest = 0.0  # an unknown kid fetches it again no sooner than this
        self._attempts = 0
        self._fetch_lock = asyncio.Lock()
        self.fetches = 0

    async def authenticate(self, token: str) -> KeyRecord | Rejection:
        try:
            header = jwt.get_unverified_header(token)
        except jwt.InvalidTokenError:
            return invalid_api_key("Malformed JWT.")
        algorithm = header.get("alg")
        if algorithm not in ALGORITHMS:
            return invalid_api_key(
                f"JWT algorithm {str(algorithm)[:16]!r} is not accepted: RS256 or ES256 only.")
        found = await self._key_for(str(header.get("kid") or ""))
        if isinstance(found, Rejection):
            return found
        key, key_algorithm = found
        try:
            claims = jwt.decode(
                token, key, algorithms=[key_algorithm], audience=self.audience,
                issuer=self.issuer, leeway=LEEWAY_SECONDS,
                options={"require": ["exp", "iss", "aud"]},
            )
        except jwt.MissingRequiredClaimError as exc:
            return invalid_api_key(f"The JWT lacks the '{exc.claim}' claim.")
        except jwt.InvalidTokenError as exc:
            return invalid_api_key(next((message for kind, message in _MESSAGES
                                         if isinstance(exc, kind)), "Invalid JWT."))
        return self._principal(claims)

    def _principal(self, claims: dict[str, Any]) -> KeyRecord | Rejection:
        subject = claims.get(self.subject_claim)
        if isinstance(subject, bool) or not isinstance(subject, str | int) or subject == "":
            return invalid_api_key(f"The JWT lacks the '{self.subject_claim}' claim.")
        models: tuple[str, ...] = ()
        if self.models_claim is not None:
            raw = claims.get(self.models_claim)
            if isinstance(raw, str):
                models = tuple(raw.split())
            elif isinstance(raw, list) and all(isinstance(m, str) for m in raw):
                models = tuple(raw)
            if not models:
                return invalid_api_key(
                    f"The JWT's '{self.models_claim}' claim names no models.")
        sub = str(subject)
        # The subject names the caller in records, limits and labels: admitted as any
        # string a caller chooses is (an identity provider's subject is a user's name).
        if (problem := caller_text.refusal(self.subject_claim, sub, SUBJECT_CHARS)) is not None:
            return invalid_api_key(f"The JWT's subject cannot be used: {problem}")
        return subject_principal(
            sub, name=f"jwt:{sub}", allowed_models=models,
            created_at=float(claims.get("iat") or self._clock()), expires_at=float(claims["exp"]),
        )

    # ---- signing keys ----------------------------------------------------------------

    async def _key_for(self, kid: str) -> tuple[Any, str] | Rejection:
        if self.jwks_url is None:
            return self._keys[""]
        now = self._clock()
        if now >= self._refresh_due or (self._pick(kid) is None and now >= self._earliest):
            await self._refresh(self._attempts)
            if not self._keys:
                return key_store_unavailable()
        picked = self._pick(kid)
        if picked is None:
            return invalid_api_key("The JWT is signed by a key this gateway does not know.")
        return picked

    def _pick(self, kid: str) -> tuple[Any, str] | None:
        if kid:
            return self._keys.get(kid)
        # No kid: acceptable only when there is exactly one key to try.
        return next(iter(self._keys.values())) if len(self._keys) == 1 else None

    async def _refresh(self, seen_attempts: int) -> None:
        """One fetch for a burst of requests: whoever waited on the lock finds it done. A
        failed fetch keeps the keys already held (and is tried again later)."""
        async with self._fetch_lock:
            if self._attempts != seen_attempts:
                return
            self._attempts += 1
            now = self._clock()
            try:
                self._keys = await self._fetch()
            except (httpx.HTTPError, ValueError, jwt.PyJWKSetError) as exc:
                log.warning("JWKS fetch from %s failed: %s", self.jwks_url, type(exc).__name__)
                retry = JWKS_MIN_REFRESH_SECONDS if self._keys else JWKS_RETRY_SECONDS
                self._refresh_due = self._earliest = now + retry
                return
            self._refresh_due = now + JWKS_MAX_AGE_SECONDS
            self._earliest = now + JWKS_MIN_REFRESH_SECONDS

    async def _fetch(self) -> dict[str, tuple[Any, str]]:
        assert self.jwks_url is not None
        async with httpx.AsyncClient(timeout=JWKS_TIMEOUT_SECONDS) as client:
            response = await client.get(self.jwks_url)
            response.raise_for_status()
            document = response.json()
        self.fetches += 1
        keys = {jwk.key_id or "": (jwk.key, jwk.algorithm_name)
                for jwk in jwt.PyJWKSet.from_dict(document).keys
                if jwk.algorithm_name in ALGORITHMS}
        if not keys:
            raise ValueError("the JWKS holds no RS256 or ES256 key")
        return keys


def _public_key(text: str) -> Any:
    """A PEM public key, given inline or as the path of a file holding one."""
    if "-----BEGIN" not in text:
        try:
            text = Path(text).read_text()
        except OSError as exc:
            raise ConfigError("JWT_PUBLIC_KEY", f"cannot read {text}: {exc.strerror}") from None
    try:
        key = serialization.load_pem_public_key(text.encode())
        _algorithm_of(key)
    except ValueError as exc:
        raise ConfigError("JWT_PUBLIC_KEY", f"not a usable PEM public key: {exc}") from None
    return key


def jwt_verifier(settings: Settings) -> JwtVerifier | None:
    """The verifier the JWT_* settings describe; None when JWT callers are not set up."""
    if not settings.jwt_jwks_url and not settings.jwt_public_key:
        return None
    if settings.jwt_jwks_url and settings.jwt_public_key:
        raise ConfigError("JWT_PUBLIC_KEY", "set JWT_JWKS_URL or JWT_PUBLIC_KEY, not both")
    for variable, value in (("JWT_ISSUER", settings.jwt_issuer),
                            ("JWT_AUDIENCE", settings.jwt_audience)):
        if not value:
            raise ConfigError(variable, "required with JWT callers: a token for another "
                                        "issuer or audience must not be accepted")
    assert settings.jwt_issuer and settings.jwt_audience
    return JwtVerifier(
        issuer=settings.jwt_issuer, audience=settings.jwt_audience,
        subject_claim=settings.jwt_subject_claim, models_claim=settings.jwt_models_claim,
        jwks_url=settings.jwt_jwks_url,
        public_key=_public_key(settings.jwt_public_key) if settings.jwt_public_key else None,
    )
