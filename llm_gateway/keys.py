"""Gateway keys: format, checksum, hashing, and the record the stores keep.

A key is ``llmg_`` + 32 random base62 characters + a 6-character base62 CRC32 of what
precedes it (GitHub's token scheme): a mistyped or forged key is refused without a
database lookup, and secret scanners can match the pattern. Stores keep only the first
12 characters (the lookup prefix) and the SHA-256 of the whole key.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
import uuid
import zlib
from dataclasses import dataclass, field

KEY_PREFIX = "llmg_"
PREFIX_LENGTH = 12
_RANDOM_LENGTH = 32
_CHECKSUM_LENGTH = 6
_BASE62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
# A key created without a limit of its own: 60 requests per 60 seconds.
DEFAULT_RATE_LIMIT = (60, 60)
_KEY_PATTERN = re.compile(rf"^{KEY_PREFIX}[0-9A-Za-z]{{{_RANDOM_LENGTH + _CHECKSUM_LENGTH}}}$")
# A JWT: three base64url parts (the signature may be empty), where a gateway key has no dots.
_JWT_SHAPE = re.compile(r"^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*$")


def _base62(number: int, width: int) -> str:
    digits = []
    for _ in range(width):
        number, digit = divmod(number, 62)
        digits.append(_BASE62[digit])
    return "".join(reversed(digits))


def _checksum(body: str) -> str:
    return _base62(zlib.crc32(body.encode()), _CHECKSUM_LENGTH)


def generate_key() -> str:
    body = KEY_PREFIX + "".join(secrets.choice(_BASE62) for _ in range(_RANDOM_LENGTH))
    return body + _checksum(body)


def is_well_formed(key: str) -> bool:
    """True when the key has our shape and its checksum matches: no lookup needed to refuse."""
    if not _KEY_PATTERN.match(key):
        return False
    return hmac.compare_digest(key[-_CHECKSUM_LENGTH:], _checksum(key[:-_CHECKSUM_LENGTH]))


def looks_like_jwt(token: str) -> bool:
    """Told apart from a gateway key by shape alone (a key has no dots)."""
    return bool(_JWT_SHAPE.match(token))


def key_prefix(key: str) -> str:
    return key[:PREFIX_LENGTH]


def key_hash(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def hash_matches(key: str, stored_hash: bytes) -> bool:
    return hmac.compare_digest(key_hash(key), stored_hash)


@dataclass(slots=True)
class KeyRecord:
    """One gateway key as stored. Times are Unix seconds (float)."""

    id: str
    subject_id: str
    name: str
    prefix: str
    key_hash: bytes
    created_at: float
    is_active: bool = True
    revoked_at: float | None = None
    expires_at: float | None = None
    last_used_at: float | None = None
    rate_limit_requests: int = DEFAULT_RATE_LIMIT[0]
    rate_limit_window_seconds: int = DEFAULT_RATE_LIMIT[1]
    allowed_models: tuple[str, ...] = field(default_factory=tuple)
    # The token bucket's capacity under RATE_LIMIT_ALGORITHM=token-bucket (llm_gateway.
    # limits): None, the limit itself. A smaller burst spreads the limit more evenly.
    rate_limit_burst: int | None = None

    def refusal(self, now: float) -> str | None:
        """Why this key may not be used now, or None when it may."""
        if self.revoked_at is not None:
            return "revoked"
        if not self.is_active:
            return "inactive"
        if self.expires_at is not None and self.expires_at <= now:
            return "expired"
        return None

    def allows_model(self, model: str) -> bool:
        return not self.allowed_models or model in self.allowed_models


def subject_principal(
    subject_id: str,
    *,
    allowed_models: tuple[str, ...] = (),
    name: str | None = None,
    created_at: float | None = None,
    expires_at: float | None = None,
) -> KeyRecord:
    """A principal without a gateway key, for a subject whose identity was established
    elsewhere (a verified JWT, the application's own login): limited under the id
    ``subject:<id>`` with the default rate limit; budgets apply to the subject."""
    return KeyRecord(
        id=f"subject:{subject_id}", subject_id=subject_id, name=name or f"subject:{subject_id}",
        prefix="", key_hash=b"", created_at=time.time() if created_at is None else created_at,
        expires_at=expires_at, allowed_models=allowed_models,
    )


def new_key_record(
    *,
    name: str,
    subject_id: str | None,
    now: float,
    rate_limit_requests: int = DEFAULT_RATE_LIMIT[0],
    rate_limit_window_seconds: int = DEFAULT_RATE_LIMIT[1],
    allowed_models: tuple[str, ...] = (),
    expires_at: float | None = None,
    rate_limit_burst: int | None = None,
) -> tuple[KeyRecord, str]:
    """A fresh record and the plaintext key, which exists only in the caller's hands."""
    plaintext = generate_key()
    record = KeyRecord(
        id=str(uuid.uuid4()),
        subject_id=subject_id or name,
        name=name,
        prefix=key_prefix(plaintext),
        key_hash=key_hash(plaintext),
        created_at=now,
        expires_at=expires_at,
        rate_limit_requests=rate_limit_requests,
        rate_limit_window_seconds=rate_limit_window_seconds,
        allowed_models=allowed_models,
        rate_limit_burst=rate_limit_burst,
    )
    return record, plaintext


_DURATION = re.compile(r"^(\d+)([smhdw])$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str) -> int:
    """'30d' -> seconds. Raises ValueError with a readable message."""
    match = _DURATION.match(text.strip())
    if not match or int(match.group(1)) == 0:
        raise ValueError(f"expected a duration like 90s, 15m, 12h, 30d or 2w, got {text!r}")
    return int(match.group(1)) * _UNIT_SECONDS[match.group(2)]


def parse_rate_limit(text: str) -> tuple[int, int]:
    """'100/60' -> (100 requests, 60 seconds)."""
    requests, sep, window = text.partition("/")
    try:
        parsed = int(requests), int(window or "60")
    except ValueError:
        raise ValueError(f"expected REQUESTS/SECONDS such as 60/60, got {text!r}") from None
    if not sep or parsed[0] <= 0 or parsed[1] <= 0:
        raise ValueError(f"expected REQUESTS/SECONDS with both > 0, got {text!r}")
    return parsed
