"""Generated HTTP/1.1 connections for tests/test_http_fuzz.py: one to three requests, each
well formed but for at most one oddity of its head and one of its framing, cut into reads.
"""

from __future__ import annotations

from hypothesis import strategies as st

from tests.http_oracle import API_PREFIX, BODY_LIMIT, MAX_HEAD

__all__ = ["connection"]

# ---- what is generated -------------------------------------------------------------------
# A request is well formed but for at most one oddity of its head and one of its framing,
# each drawn from a list (mostly none), so that a pipeline often gets to its later
# requests and every oddity is met on its own as well as after and before others.

METHODS = st.sampled_from(["GET", "POST", "POST", "POST", "PUT", "DELETE", "OPTIONS", "PATCH",
                           "HEAD"])
TARGETS = st.sampled_from([
    "/v1/echo", "/v1/stream", "/v1/echo?a=b&c=%20d", "/v1/a%20b/%E2%82%AC", "/v1/echo#frag",
    "/v1//x", "/v1/%zz", "/healthz", "/other?x", "*", "http://gw/v1/echo?x=1", "/v1/a%00b",
]) | st.text("abcXYZ019-._~%/?=&;:@!$'()*+,", max_size=12).map(API_PREFIX.__add__)
NAMES = st.sampled_from([b"x-a", b"X-Mixed", b"accept", b"user-agent", b"content-type",
                         b"authorization"]) | st.binary(max_size=0).flatmap(
    lambda _: st.text("abcdefghijklmnopqrstuvwxyzABC0123456789!#$%&'*+-.^_`|~", min_size=1,
                      max_size=8).map(str.encode))
VALUES = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=16).map(
    lambda text: text.strip().encode())
HEAD_ODDITIES = [
    "bare LF", "obs-fold", "control character", "NUL", "lone CR", "space before colon",
    "odd name", "no Host", "Host twice", "unknown method", "HTTP/1.0", "HTTP/1.0",
    "other version", "obs-text", "padded value", "empty value", "close", "keep-alive",
    "upgrade", "Upgrade alone", "expect"]
ODD_VALUES = {
    "control character": st.sampled_from([b"a\x01b", b"a\x08b", b"a\x0bb", b"a\x1fb", b"a\x7fb"]),
    "NUL": st.just(b"a\x00b"), "lone CR": st.just(b"a\rb"), "obs-text": st.just(b"\xe9t\xe9"),
    "padded value": st.sampled_from([b"  padded \t", b"\tx", b"x  "]), "empty value": st.just(b""),
    "obs-fold": st.sampled_from([b"a\r\n folded", b"a\r\n\tfolded"]),
}
SPECIAL_FIELDS = {
    "close": [(b"Connection", b"close")], "keep-alive": [(b"Connection", b"keep-alive")],
    "upgrade": [(b"Connection", b"Upgrade"), (b"Upgrade", b"h2c")],
    "Upgrade alone": [(b"Upgrade", b"websocket")], "expect": [(b"Expect", b"100-continue")],
}
BODIES = st.binary(max_size=40) | st.sampled_from([
    b"0\r\n\r\nGET /v1/smuggled HTTP/1.1\r\nHost: x\r\n\r\n", b"\r\n\r\n", b'{"model": "m"}',
    b"GET /v1/inside HTTP/1.1\r\nHost: gw\r\n\r\n"])
FRAMINGS = st.sampled_from(["length"] * 10 + ["chunked"] * 8 + ["none"] * 3 + [
    "short", "long", "te+cl", "dup-cl", "list-cl", "huge-cl", "over-limit", "signed-cl",
    "te-other"])
CHUNK_ODDITIES = ["bad size", "extension", "odd extension", "bad terminator", "bare LF",
                  "trailers", "odd trailer", "padded size"]
EXTENSIONS = {
    "extension": st.sampled_from([b";a", b";a=b", b';a="q s"', b";a=b;c=d", b";a="]),
    "odd extension": st.sampled_from([b"; a=b", b";a=b c", b";", b";a=\x01", b" ", b"\t",
                                      b";\xe9", b";a = b"]),
}


def oddity(kinds: list[str]) -> st.SearchStrategy[str | None]:
    return st.sampled_from([None] * 2 * len(kinds) + kinds)  # none, two times in three


@st.composite
def head(draw: st.DrawFn) -> bytes:
    """A request line and the header fields before the framing ones."""
    odd = draw(oddity(HEAD_ODDITIES))
    method = draw(st.sampled_from(["FOO", "get", "GETS"]) if odd == "unknown method"
                  else METHODS)
    version = {"HTTP/1.0": "HTTP/1.0", "other version": draw(st.sampled_from(
        ["HTTP/2.0", "HTTP/1.2", "HTTP/3", "http/1.1", ""]))}.get(odd or "", "HTTP/1.1")
    line = f"{method} {draw(TARGETS)} {version}".rstrip().encode("latin-1")
    fields = [(b"Host", b"gw")] * {"no Host": 0, "Host twice": 2}.get(odd or "", 1)
    fields += draw(st.lists(st.tuples(NAMES, VALUES), max_size=3))
    fields += SPECIAL_FIELDS.get(odd or "", [])
    if odd in ODD_VALUES:
        fields.append((b"X-Odd", draw(ODD_VALUES[odd])))
    elif odd == "odd name":
        fields.append((draw(st.sampled_from([b"x a", b"x{", b"", b"x\x00", b"\xe9"])), b"v"))
    elif odd == "space before colon":
        fields.append((b"X-Odd ", b"v"))
    draw(st.randoms()).shuffle(fields)
    ends = [b"\r\n"] * (len(fields) + 1)
    if odd == "bare LF":
        ends[draw(st.integers(0, len(fields)))] = b"\n"
    return line + ends[0] + b"".join(name + b": " + value + end
                                     for (name, value), end in zip(fields, ends[1:], strict=True))


@st.composite
def chunked_body(draw: st.DrawFn, body: bytes) -> bytes:
    odd = draw(oddity(CHUNK_ODDITIES))
    cuts = sorted(draw(st.sets(st.integers(1, max(1, len(body) - 1)), max_size=3)))
    pieces = [body[start:end] for start, end in zip([0, *cuts], [*cuts, len(body)],
                                                    strict=True) if body[start:end]]
    lines = [[b"%x" % len(piece), b"", b"\r\n", piece, b"\r\n"] for piece in pieces]
    lines.append([b"0", b"", b"\r\n", b"", b""])
    where = draw(st.integers(0, len(lines) - 1))
    if odd == "bad size":
        lines[where][0] = draw(st.sampled_from([b"zz", b"-1", b"", b"FFFFFFFFFFFFFFFFF", b"1_0",
                                                b"0x1", b"99999999999999999999999"]))
    elif odd == "padded size":
        lines[where][0] = draw(st.sampled_from([b"0", b"0" * 18])) + lines[where][0]
    elif odd in EXTENSIONS:
        lines[where][1] = draw(EXTENSIONS[odd])
    elif odd == "bare LF":
        lines[where][2] = b"\n"
    elif odd == "bad terminator" and where < len(pieces):
        lines[where][4] = draw(st.sampled_from([b"\n", b"", b"xx", b"\r"]))
    trailers = {"trailers": [b"X-T: v\r\n", b"X-T: v\r\nAuthorization: Bearer t\r\n"],
                "odd trailer": [b"X-T: v\r\n folded\r\n", b"X-T: \x01\r\n", b"X-T : v\r\n",
                                b"X-T: v\n"]}.get(odd or "", [b""])
    return b"".join(b"".join(line) for line in lines) + draw(st.sampled_from(trailers)) + b"\r\n"


@st.composite
def request(draw: st.DrawFn) -> bytes:
    start, body, framing = draw(head()), draw(BODIES), draw(FRAMINGS)
    length = b"Content-Length: %d\r\n" % len(body)
    chunked = b"Transfer-Encoding: chunked\r\n"
    fields, sent = {
        "length": (length, body), "none": (b"", b""),
        "short": (b"Content-Length: %d\r\n" % max(0, len(body) - 3), body),
        "long": (b"Content-Length: %d\r\n" % (len(body) + 3), body),
        "dup-cl": (length + length, body),
        "list-cl": (b"Content-Length: %d, %d\r\n" % (len(body), len(body)), body),
        "huge-cl": (b"Content-Length: 99999999999999999999999\r\n", body),
        "over-limit": (b"Content-Length: %d\r\n" % (BODY_LIMIT + 1), b""),
        "signed-cl": (b"Content-Length: +%d\r\n" % len(body), body),
    }.get(framing, (b"", b""))
    if framing in ("chunked", "te+cl", "te-other"):
        coding = draw(st.sampled_from([b"gzip, chunked", b"identity", b"Chunked",
                                       b"chunked, gzip", b"gzip"]))
        fields = {"chunked": chunked, "te+cl": chunked + length,
                  "te-other": b"Transfer-Encoding: " + coding + b"\r\n"}[framing]
        sent = draw(chunked_body(body))
    return start + fields + b"\r\n" + sent


@st.composite
def connection(draw: st.DrawFn) -> tuple[bytes, list[bytes], list[int]]:
    """(the bytes a client sends, cut into what each read returns, how many loop turns
    the stub engine takes to admit each request)."""
    requests = draw(st.lists(request(), min_size=1, max_size=3))
    if draw(st.sampled_from([False] * 30 + [True])):  # past MAX_HEADER_BYTES, first of all
        line, newline, rest = requests[0].partition(b"\n")
        requests[0] = line + newline + b"X-Big: " + b"x" * (MAX_HEAD + 5000) + b"\r\n" + rest
    data = draw(st.sampled_from([b""] * 10 + [b"\r\n", b"\n"])).join([b"", *requests])
    how = draw(st.sampled_from(["whole", "bytes", "cuts", "cuts"]))
    if how == "whole" or len(data) < 2:
        reads = [data]
    elif how == "bytes" and len(data) <= 4096:  # (byte by byte: up to a few kB)
        reads = [data[index:index + 1] for index in range(len(data))]
    else:
        cuts = sorted(draw(st.sets(st.integers(1, len(data) - 1), min_size=1, max_size=8)))
        reads = [data[start:end] for start, end in zip([0, *cuts], [*cuts, len(data)],
                                                       strict=True)]
    return data, reads, draw(st.lists(st.integers(0, 3), min_size=4, max_size=4))
