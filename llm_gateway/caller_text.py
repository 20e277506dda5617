"""What a caller may name: the one check for every string a caller chooses that the gateway
stores, labels, logs or echoes (the ``model``, the end user, tags), and the one way a value
the gateway did not choose is put into a response header.

Each place such a string lands has its own rules: a response header takes visible Latin-1
and must never see CR or LF (a model name with ``\\r\\n`` in it split a response in two on
a keep-alive connection), orjson and the databases refuse lone surrogates (a model
``"x\\ud800"`` failed admission after its budget was reserved), a metric label or a log
line must stay small (a 900 000-character name made ``/metrics`` 21.6 MB), and a log
viewer takes a line or paragraph separator, or a bidirectional override, for a real one.
Rather than escape for each sink, a caller's string is admitted once, here, before
anything is reserved or sent: valid Unicode (no lone surrogates), no control or format
characters, no line or paragraph separators, and at most a bound per field
(``FIELD_CHARS``). The bounds are documented in the error table of docs/protocols.md.

A header value built from such a string (``x-llm-gateway-upstream`` names a passthrough
model as the caller spelled it) goes through ``header_value``: percent-encoded outside
visible ASCII, so a header the gateway writes is plain ASCII whatever the caller sent.
"""

from __future__ import annotations

import re
import unicodedata
from urllib.parse import quote

# The longest string admitted in each field, in characters (code points).
MODEL_CHARS = 256
USER_CHARS = 256
TAG_KEY_CHARS = 64
TAG_VALUE_CHARS = 256
MAX_TAGS = 16
FIELD_CHARS = {"model": MODEL_CHARS, "user": USER_CHARS}

# ASCII's control characters (C0 and DEL): the whole check for an ASCII string.
_ASCII_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# Unicode categories refused: controls (C0, DEL, C1), format characters (bidirectional
# overrides, zero-width characters), lone surrogates, line and paragraph separators.
_REFUSED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
_TAG_KEY = re.compile(r"[A-Za-z0-9_.:-]+")
# What a header value keeps as it is: visible ASCII but the percent sign (the escape).
_HEADER_SAFE = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c) != "%")


def refusal(name: str, value: str, limit: int) -> str | None:
    """Why ``value`` (the caller's ``name``) cannot be admitted, in a sentence naming the
    field; None when it can."""
    if len(value) > limit:
        return f"'{name}' must be at most {limit} characters (it has {len(value)})."
    if value.isascii():
        found = _ASCII_CONTROL.search(value)
        bad = found.group() if found else None
    else:
        bad = next((c for c in value if unicodedata.category(c) in _REFUSED_CATEGORIES), None)
    if bad is None:
        return None
    what = "a lone surrogate" if 0xD800 <= ord(bad) <= 0xDFFF else "a control character"
    return f"'{name}' holds {what} (U+{ord(bad):04X}); it must be printable text."


def tags_of(header: str) -> dict[str, str] | str:
    """The tags of an ``x-llm-gateway-tags`` header (``feature=search, env=prod``), or the
    sentence refusing them. The header arrives as Latin-1 (the wire's bytes one to one):
    its bytes must be UTF-8."""
    try:
        text = header.encode("latin-1").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        return "'x-llm-gateway-tags' must be UTF-8."
    tags: dict[str, str] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        key, equals, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not equals or not key or not _TAG_KEY.fullmatch(key) or len(key) > TAG_KEY_CHARS:
            return (f"'x-llm-gateway-tags' takes comma-separated key=value pairs, each key "
                    f"of letters, digits and _.:- (at most {TAG_KEY_CHARS} characters).")
        problem = refusal(f"x-llm-gateway-tags: {key}", value, TAG_VALUE_CHARS)
        if problem is not None:
            return problem
        tags[key] = value
        if len(tags) > MAX_TAGS:
            return f"'x-llm-gateway-tags' holds more than {MAX_TAGS} tags."
    return tags


def metadata_tags(metadata: object) -> dict[str, str]:
    """The string pairs of a body's ``metadata`` (Responses, chat) that fit a tag's bounds,
    at most MAX_TAGS: the record's tags beside the header's. A pair that does not fit is
    left off the record, never refused: the metadata is the protocol's, for the provider."""
    if not isinstance(metadata, dict):
        return {}
    tags: dict[str, str] = {}
    for key, value in metadata.items():
        if len(tags) == MAX_TAGS:
            break
        if (isinstance(key, str) and isinstance(value, str) and len(key) <= TAG_KEY_CHARS
                and _TAG_KEY.fullmatch(key)
                and refusal(key, value, TAG_VALUE_CHARS) is None):
            tags[key] = value
    return tags


def merged_tags(header: dict[str, str], metadata: dict[str, str]) -> dict[str, str]:
    """A request's tags: the header's, then the metadata's it does not name, MAX_TAGS in
    all (the header's are the caller's word about the gateway, so they win)."""
    tags = dict(header)
    for key, value in metadata.items():
        if len(tags) >= MAX_TAGS:
            break
        tags.setdefault(key, value)
    return tags


def header_value(value: str) -> str:
    """``value`` fit for a response header whatever it holds: visible ASCII kept, anything
    else (space, CR, LF, any non-ASCII) percent-encoded as UTF-8."""
    if value.isascii() and value.isprintable() and " " not in value and "%" not in value:
        return value
    return quote(value, safe=_HEADER_SAFE, errors="surrogatepass")
