"""Admin tokens: the credential of the admin API and console.

An admin token is ``llmga_`` + 32 random base62 characters + a 6-character checksum, the
gateway key's scheme (``llm_gateway.keys``, whose checksum and hashing this reuses) under
another prefix. The shapes are disjoint: a gateway key has ``_`` where an admin token has
``a``, so neither is ever taken for the other, whichever side checks. Stores keep the first
13 characters (``llmga_`` + 7, the same 7 random characters of lookup as a gateway key's
prefix) and the SHA-256 of the whole token.
"""

from __future__ import annotations

import re
import secrets
import uuid

from llm_gateway.keys import _BASE62, _checksum, hash_matches, key_hash
from llm_gateway.stores.admin import AdminTokenRecord

TOKEN_PREFIX = "llmga_"
TOKEN_PREFIX_LENGTH = 13
_RANDOM_LENGTH = 32
_CHECKSUM_LENGTH = 6
_TOKEN_PATTERN = re.compile(
    rf"^{TOKEN_PREFIX}[0-9A-Za-z]{{{_RANDOM_LENGTH + _CHECKSUM_LENGTH}}}$")


def generate_token() -> str:
    body = TOKEN_PREFIX + "".join(secrets.choice(_BASE62) for _ in range(_RANDOM_LENGTH))
    return body + _checksum(body)


def is_well_formed_token(token: str) -> bool:
    """Our shape and a matching checksum: a mistyped or forged token costs no lookup."""
    if not _TOKEN_PATTERN.match(token):
        return False
    return secrets.compare_digest(token[-_CHECKSUM_LENGTH:],
                                  _checksum(token[:-_CHECKSUM_LENGTH]))


def token_prefix(token: str) -> str:
    return token[:TOKEN_PREFIX_LENGTH]


def token_matches(token: str, record: AdminTokenRecord) -> bool:
    return hash_matches(token, record.token_hash)


def new_admin_token(name: str, now: float) -> tuple[AdminTokenRecord, str]:
    """A fresh record and the plaintext token, which exists only in the caller's hands."""
    token = generate_token()
    record = AdminTokenRecord(id=str(uuid.uuid4()), name=name, prefix=token_prefix(token),
                              token_hash=key_hash(token), created_at=now)
    return record, token
