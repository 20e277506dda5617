"""h11 as the oracle of serve's HTTP/1.1 protocol (tests/test_http_fuzz.py): what a
connection's bytes are, request by request, as h11 (``h11.Connection(h11.SERVER)``) reads
them, and where serve reads them otherwise on purpose.

Where the two differ by design, the difference is one of ``STRICTER`` below, each a narrow
rule naming the bytes it is about and why serve refuses them (llhttp's strict framing,
a smuggling defence, RFC 9110/9112's own words); the comparison treats a request matching
one as malformed. Two leniencies of serve are RFC 9112's own and are kept too:

- empty lines before a request line are skipped (§2.2: a server SHOULD ignore at least
  one), where h11 refuses them: the oracle skips them as well;
- the request line's parts may be separated by more than one space (§3: a recipient MAY
  parse on whitespace boundaries), and a chunk size may have more than h11's 20 digits
  (leading zeros; §7.1 sets no bound): the generator writes neither, so they are no rule.

Everything else h11 accepts serve must answer as the same request, and everything else h11
refuses serve must refuse.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass

import h11

__all__ = ["API_PREFIX", "Parsed", "Verdict", "verdict"]

# Requests the stub engine reads the body of (the API); every other path is answered
# from its head alone, as serve answers its probes and 404s.
API_PREFIX = "/v1/"
BODY_LIMIT = 4096  # serve's REQUEST_BODY_LIMIT_BYTES in the fuzzer
MAX_HEAD = 64 * 1024  # serve's MAX_HEADER_BYTES default, h11's buffer bound as well

# The methods llhttp parses (llhttp/src/llhttp/constants.ts, HTTP methods); any other
# token is refused where h11 takes any token.
LLHTTP_METHODS = frozenset([
    "DELETE", "GET", "HEAD", "POST", "PUT", "CONNECT", "OPTIONS", "TRACE", "COPY", "LOCK",
    "MKCOL", "MOVE", "PROPFIND", "PROPPATCH", "SEARCH", "UNLOCK", "BIND", "REBIND", "UNBIND",
    "ACL", "REPORT", "MKACTIVITY", "CHECKOUT", "MERGE", "M-SEARCH", "NOTIFY", "SUBSCRIBE",
    "UNSUBSCRIBE", "PATCH", "PURGE", "MKCALENDAR", "LINK", "UNLINK", "SOURCE", "QUERY"])
_LEADING_EMPTY_LINES = re.compile(rb"(?:\r?\n)+")
_TOKEN = rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+"
_QUOTED = rb'"(?:[\t !#-\[\]-~\x80-\xff]|\\[\t -~\x80-\xff])*"'
# RFC 9112 §7.1.1's chunk-ext without its optional BWS (llhttp refuses whitespace there).
_CHUNK_LINE = re.compile(rb"[0-9A-Fa-f]+(?:;" + _TOKEN + rb"(?:=(?:" + _TOKEN + b"|"
                         + _QUOTED + rb")?)?)*\r\n")
_CTL = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")


@dataclass(frozen=True)
class Parsed:
    """One request as h11 read it, in the terms serve's engine sees (``IncomingRequest``)."""

    method: str
    path: str  # percent-decoded, as serve decodes it
    query: str
    headers: tuple[tuple[str, str], ...]  # names lower-case, h11's normalised values
    body: bytes  # b"" when serve answers from the head alone
    closes: bool  # nothing after it on the connection is read
    early: bool  # serve answers it once its head is in (not the API, or declared too large)

    def echo(self) -> dict[str, object]:
        return {"method": self.method, "path": self.path, "query": self.query,
                "headers": [list(pair) for pair in self.headers],
                "body": self.body.decode("latin-1")}


@dataclass(frozen=True)
class Verdict:
    requests: tuple[Parsed, ...]  # complete and accepted, in order
    ending: str  # "open", "closed" (after the last), "incomplete" or "malformed"
    pending: Parsed | None = None  # the incomplete or malformed one, if its head was read
    why: str = ""


def _lines(data: bytes) -> list[bytes]:
    return [line for line in re.split(rb"(?<=\n)", data) if line]


@dataclass(frozen=True)
class Framing:
    """The framing lines of one request's bytes (h11 accepted them, or read them so far),
    each with its line end: the head's, each chunk-size line, the trailer section's."""

    head: list[bytes]
    chunks: list[bytes]
    trailers: list[bytes]
    body_checked: bool  # the body's framing was read (h11 had its head)

    @classmethod
    def of(cls, raw: bytes, chunked: bool) -> Framing:
        end = re.search(rb"\n\r?\n", raw)
        if end is None:
            return cls(_lines(raw), [], [], False)
        head, rest, chunks = _lines(raw[:end.end()]), raw[end.end():], []
        while chunked:
            line, newline, rest = rest.partition(b"\n")
            size = re.match(rb"[0-9A-Fa-f]+", line)
            if not newline or size is None:
                return cls(head, chunks, [], True)
            chunks.append(line + newline)
            if int(size.group(), 16) == 0:
                return cls(head, chunks, _lines(rest), True)
            rest = rest[int(size.group(), 16) + 2:]  # the data and its CRLF (h11's rule)
        return cls(head, chunks, [], True)

    def fields(self) -> list[bytes]:
        return self.head[1:] + self.trailers


def _bare_lf(framing: Framing, parsed: h11.Request | None) -> bool:
    return any(not line.endswith(b"\r\n") and line.endswith(b"\n")
               for line in framing.head + framing.chunks + framing.trailers)


def _obs_fold(framing: Framing, parsed: h11.Request | None) -> bool:
    return any(line[:1] in (b" ", b"\t") for line in framing.fields())


def _control_character(framing: Framing, parsed: h11.Request | None) -> bool:
    return any(_CTL.search(line.rstrip(b"\r\n")) for line in framing.fields())


def _unknown_method(framing: Framing, parsed: h11.Request | None) -> bool:
    return parsed is not None and parsed.method.decode("ascii") not in LLHTTP_METHODS


def _other_version(framing: Framing, parsed: h11.Request | None) -> bool:
    return parsed is not None and parsed.http_version not in (b"1.0", b"1.1")


def _length_and_chunked(framing: Framing, parsed: h11.Request | None) -> bool:
    names = {name for name, _ in parsed.headers} if parsed is not None else set()
    return {b"content-length", b"transfer-encoding"} <= names


def _length_repeated(framing: Framing, parsed: h11.Request | None) -> bool:
    lengths = [line for line in framing.head[1:] if line.lower().startswith(b"content-length:")]
    return len(lengths) > 1 or any(b"," in line for line in lengths)


def _head_too_large(framing: Framing, parsed: h11.Request | None) -> bool:
    return sum(map(len, framing.head)) > MAX_HEAD


def _connection(headers: h11._headers.Headers) -> set[str]:
    return {token.strip().lower() for name, value in headers if name == b"connection"
            for token in value.decode("latin-1").split(",")}


def _asks_upgrade(headers: h11._headers.Headers) -> bool:
    """llhttp's rule: a Connection token "upgrade" and an Upgrade field (h11 looks at the
    Upgrade field alone, and goes on once the upgrade is declined)."""
    return "upgrade" in _connection(headers) and any(name == b"upgrade" for name, _ in headers)


def _closes(request: h11.Request) -> bool:
    """Nothing after it is read: HTTP/1.0, "close", or an upgrade (as h11 says of a whole
    request, here of one whose head alone is in)."""
    return (request.http_version == b"1.0" or "close" in _connection(request.headers)
            or _asks_upgrade(request.headers))


def _upgrade_with_body(framing: Framing, parsed: h11.Request | None) -> bool:
    if parsed is None or not _asks_upgrade(parsed.headers):
        return False
    return any(name == b"transfer-encoding" or (name == b"content-length" and int(value))
               for name, value in parsed.headers)


def _chunk_too_large(framing: Framing, parsed: h11.Request | None) -> bool:
    return any(int(re.match(rb"[0-9A-Fa-f]+", line).group(), 16) >= 2**60  # type: ignore[union-attr]
               for line in framing.chunks)


def _chunk_line(framing: Framing, parsed: h11.Request | None) -> bool:
    return any(not _CHUNK_LINE.fullmatch(line) for line in framing.chunks)


# (why serve refuses what h11 accepts, the rule)
Rule = Callable[[Framing, "h11.Request | None"], bool]
STRICTER: list[tuple[str, Rule]] = [
    ("a bare LF ends a line: RFC 9112 §2.2 lets a recipient accept it, llhttp does not "
     "(the smuggling class of CRLF/LF disagreements)", _bare_lf),
    ("obs-fold: RFC 9112 §5.2 lets a server refuse it with 400, as llhttp does",
     _obs_fold),
    ("a control character in a field value: RFC 9110 §5.5 forbids them; h11 lets all but "
     "NUL, CR and LF through", _control_character),
    ("a method llhttp does not know (the gateway serves none of them)", _unknown_method),
    ("an HTTP version other than 1.0 and 1.1 (h11 takes any digit.digit)",
     _other_version),
    ("Content-Length beside Transfer-Encoding: RFC 9112 §6.1 lets a server refuse it; "
     "refused, so no body hides a request (smuggling)", _length_and_chunked),
    ("Content-Length repeated or a list: h11 merges equal values, llhttp refuses them all",
     _length_repeated),
    ("a head over MAX_HEADER_BYTES: 431 (h11 bounds only a head not yet complete)",
     _head_too_large),
    ("a body on a request asking to upgrade: llhttp leaves what follows the head to the "
     "new protocol, and serve upgrades to nothing (the body would be lost)",
     _upgrade_with_body),
    ("a chunk size past 2^60 (llhttp's overflow bound is near 2^64; h11 waits for the data)",
     _chunk_too_large),
    ("a chunk-size line with whitespace or a chunk-ext off RFC 9112 §7.1.1's grammar "
     "(h11 takes anything after ';')", _chunk_line),
]


def _stricter(raw: bytes, parsed: h11.Request | None, chunked: bool) -> tuple[str, bool] | None:
    """Why serve refuses these bytes when h11 does not, and whether for their head (then
    serve answers nothing of the request) or their body's framing."""
    framing = Framing.of(raw, chunked)
    head = Framing(framing.head, [], [], False)
    for why, rule in STRICTER:
        if rule(head, parsed):
            return why, True
    for why, rule in STRICTER if framing.body_checked else []:
        if rule(framing, parsed):
            return why, False
    return None


def _split_target(target: str) -> tuple[str, str]:
    if not target.startswith("/"):  # absolute-form (or "*"): its path and query
        parts = urllib.parse.urlsplit(target)
        return (parts.path or target) if parts.scheme else target, parts.query
    path, _, query = target.split("#", 1)[0].partition("?")
    return path, query


def _parsed(request: h11.Request, body: bytes, closes: bool) -> Parsed:
    path, query = _split_target(request.target.decode("latin-1"))
    if "%" in path:
        path = urllib.parse.unquote(path)
    headers = tuple((name.decode("latin-1").lower(), value.decode("latin-1"))
                    for name, value in request.headers.raw_items())
    length = next((value for name, value in headers if name == "content-length"), "")
    early = (not path.startswith(API_PREFIX) or request.method == b"HEAD"
             or (length.isdigit() and int(length) > BODY_LIMIT))
    return Parsed(request.method.decode("ascii"), path, query, headers,
                  b"" if early else body, closes or _closes(request), early)


def _one(data: bytes) -> tuple[str, h11.Request | None, bytes, bytes, str]:
    """The first request of ``data``: (how it ended, its head, its body, what follows it,
    h11's complaint)."""
    connection = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
    connection.receive_data(data)
    head, body = None, bytearray()
    try:
        while True:
            event = connection.next_event()
            if event is h11.NEED_DATA:
                return "incomplete", head, bytes(body), b"", ""
            if isinstance(event, h11.Request):
                head = event
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                # Answered (an upgrade declined): h11 then says whether the client may go on.
                connection.send(h11.Response(status_code=200, headers=[("content-length", "0")]))
                connection.send(h11.EndOfMessage())
                ending = "closed" if connection.their_state is h11.MUST_CLOSE else "open"
                return ending, head, bytes(body), connection.trailing_data[0], ""
    except h11.RemoteProtocolError as exc:
        return "malformed", head, bytes(body), b"", str(exc)


def verdict(data: bytes) -> Verdict:
    """What the oracle says of a connection's bytes."""
    requests: list[Parsed] = []
    rest = data
    while True:
        if empty_lines := _LEADING_EMPTY_LINES.match(rest):  # RFC 9112 §2.2: skipped
            rest = rest[empty_lines.end():]
        if not rest:
            return Verdict(tuple(requests), "open")
        ending, head, body, after, why = _one(rest)
        chunked = head is not None and any(
            name == b"transfer-encoding" for name, _ in head.headers)
        raw = rest[:len(rest) - len(after)]
        stricter = _stricter(raw, head, chunked)
        if stricter is not None and (ending != "malformed" or stricter[1]):
            reason, in_head = stricter
            pending = None if in_head or head is None else _parsed(head, b"", False)
            return Verdict(tuple(requests), "malformed", pending, reason)
        if ending in ("incomplete", "malformed"):
            pending = None if head is None else _parsed(head, b"", False)
            return Verdict(tuple(requests), ending, pending, why)
        assert head is not None
        parsed = _parsed(head, body, ending == "closed")
        requests.append(parsed)
        if parsed.closes:
            return Verdict(tuple(requests), "closed")
        rest = after
