"""Secrets at rest and on screen: provider keys sealed with AES-256-GCM under
``LLM_GATEWAY_SECRET_KEY``, and the one way any secret is shown (``mask_secret``).

``LLM_GATEWAY_SECRET_KEY`` is read one of two ways:

- base64 (standard or URL-safe, padding optional) of exactly 32 bytes, e.g. the output of
  ``openssl rand -base64 32``: used as the AES-256 key as it is;
- any other string of at least 32 characters: a passphrase, stretched to 32 bytes with
  HKDF-SHA256. HKDF adds no work factor, hence the length floor: a short passphrase would
  be guessable, so it is refused rather than stretched.

Each sealed value has its own random 96-bit nonce and is bound to its context (the
provider's name) as associated data, so a ciphertext copied onto another row does not open.
"""

from __future__ import annotations

import base64
import binascii
import os

# cryptography is imported where a key is derived or sealed, not here: most processes only
# mask secrets, and the library costs each of them ~7 MiB of memory.
from llm_gateway.config import ConfigError, Secret

KEY_BYTES = 32
NONCE_BYTES = 12
MIN_PASSPHRASE_CHARACTERS = 32
# Fixed, public: HKDF's salt and info only separate this use from any other of the same
# passphrase; the secret is the passphrase.
_HKDF_SALT = b"llm-gateway"
_HKDF_INFO = b"llm-gateway provider keys v1"
# Secrets shorter than this are masked whole: 8 visible characters would be most of them.
_MASK_MIN_LENGTH = 12


class SecretKeyError(ConfigError):
    """LLM_GATEWAY_SECRET_KEY is unusable; str() says why (never the value). A ConfigError,
    so whoever builds a SecretBox at start-up stops with that one line."""

    def __init__(self, problem: str) -> None:
        super().__init__("LLM_GATEWAY_SECRET_KEY", problem)


class CannotDecrypt(Exception):
    """The sealed value does not open: another secret key, another context, or tampering."""


def derive_key(text: str) -> bytes:
    """The 32-byte AES key ``LLM_GATEWAY_SECRET_KEY`` stands for (see the module's rules)."""
    text = text.strip()
    raw = _base64_32(text)
    if raw is not None:
        return raw
    if len(text) < MIN_PASSPHRASE_CHARACTERS:
        raise SecretKeyError(
            "expected base64 of 32 bytes (e.g. `openssl rand -base64 32`) or a passphrase "
            f"of at least {MIN_PASSPHRASE_CHARACTERS} characters"
        )
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    return HKDF(hashes.SHA256(), KEY_BYTES, _HKDF_SALT, _HKDF_INFO).derive(text.encode())


def _base64_32(text: str) -> bytes | None:
    padded = text + "=" * (-len(text) % 4)
    for decode in (base64.b64decode, base64.urlsafe_b64decode):
        try:
            raw = decode(padded.encode())
        except (binascii.Error, ValueError):
            continue
        if len(raw) == KEY_BYTES:
            return raw
    return None


class SecretBox:
    """Seals and opens short secrets (provider keys) with one AES-256-GCM key."""

    def __init__(self, key: bytes) -> None:
        if len(key) != KEY_BYTES:
            raise SecretKeyError(f"an AES-256 key is {KEY_BYTES} bytes")
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        self._aead = AESGCM(key)

    @classmethod
    def from_secret(cls, secret: Secret) -> SecretBox:
        return cls(derive_key(secret.reveal()))

    def seal(self, plaintext: str, *, context: str) -> tuple[bytes, bytes]:
        """(nonce, ciphertext with its tag) of ``plaintext``, bound to ``context``."""
        nonce = os.urandom(NONCE_BYTES)
        return nonce, self._aead.encrypt(nonce, plaintext.encode(), context.encode())

    def open(self, nonce: bytes, ciphertext: bytes, *, context: str) -> str:
        from cryptography.exceptions import InvalidTag

        try:
            return self._aead.decrypt(nonce, ciphertext, context.encode()).decode()
        except InvalidTag:
            raise CannotDecrypt(f"the sealed value for {context!r} does not open with this "
                                "LLM_GATEWAY_SECRET_KEY") from None


def provider_key_context(name: str) -> str:
    """What a provider's stored key is sealed to: a key sealed for one provider does not
    open as another's (the ciphertext moved to another row fails its tag)."""
    return f"provider-key:{name}"


def mask_secret(secret: str) -> str:
    """``sk-abcdef…9f3c`` → ``sk-a…9f3c``: enough to tell keys apart, never enough to use
    one. Short secrets are masked whole."""
    if len(secret) < _MASK_MIN_LENGTH:
        return "****"
    return f"{secret[:4]}…{secret[-4:]}"
