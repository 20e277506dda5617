"""Server-sent events, sans-IO: feed bytes as they arrive, get events back.

Runs on every chunk of every streamed response, so lines are cut with bytes.split/replace rather
than by walking bytes in Python, and each block of complete lines is decoded once.
"""

from dataclasses import dataclass

_BOM = b"\xef\xbb\xbf"


@dataclass(slots=True)
class SSEEvent:
    data: str
    event: str | None = None  # None means the spec's default type, "message"
    id: str | None = None


class SSEParser:
    """Incremental event-stream parser following the WHATWG rules.

    See https://html.spec.whatwg.org/multipage/server-sent-events.html#event-stream-interpretation

    `retry` and last-event-id persistence are left out: a relaying gateway never reconnects.
    """

    __slots__ = ("_at_stream_start", "_data", "_event", "_id", "_partial_line", "_skip_next_lf")

    def __init__(self) -> None:
        # Bytes of a line whose terminator has not arrived yet; never contains CR or LF.
        self._partial_line = bytearray()
        self._at_stream_start = True
        # A chunk ended in CR: if the next one starts with LF, that LF belongs to the same CRLF.
        self._skip_next_lf = False
        self._data: list[str] | None = None  # None until a data line is seen in this event
        self._event: str | None = None
        self._id: str | None = None

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """Return the events completed by `chunk`."""
        if self._at_stream_start:
            # Hold the first bytes back until we can tell whether they are a (split) BOM.
            self._partial_line += chunk
            if len(self._partial_line) < len(_BOM) and _BOM.startswith(self._partial_line):
                return []
            self._at_stream_start = False
            chunk = bytes(self._partial_line)
            self._partial_line.clear()
            if chunk.startswith(_BOM):
                chunk = chunk[len(_BOM) :]

        if self._skip_next_lf and chunk:
            self._skip_next_lf = False
            if chunk[0] == 0x0A:
                chunk = chunk[1:]
        if b"\r" in chunk:
            # Safe to normalise per chunk: a CRLF split across chunks is handled by
            # _skip_next_lf, and _partial_line holds no CR that could pair with this chunk.
            self._skip_next_lf = chunk.endswith(b"\r")
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")

        last_lf = chunk.rfind(b"\n")
        if last_lf < 0:
            self._partial_line += chunk
            return []
        complete = chunk[: last_lf + 1]
        if self._partial_line:
            complete = bytes(self._partial_line) + complete
            self._partial_line.clear()
        self._partial_line += chunk[last_lf + 1 :]

        # Decoding the whole block at once equals decoding line by line: LF never occurs inside
        # a UTF-8 sequence, and the decoder never swallows it while replacing invalid bytes.
        lines = complete.decode("utf-8", "replace").split("\n")
        lines.pop()  # the empty string after the final LF
        return self._process_lines(lines)

    def between_events(self) -> bool:
        """Nothing of an unfinished line or event is held: the next bytes start afresh."""
        return (not self._at_stream_start and not self._partial_line and self._data is None
                and not self._skip_next_lf and self._event is None and self._id is None)

    def close(self) -> list[SSEEvent]:
        """Mark the end of the stream. An event without its blank line is discarded (per spec)."""
        self._partial_line.clear()
        self._at_stream_start = False
        self._skip_next_lf = False
        self._reset_event()
        return []

    def _process_lines(self, lines: list[str]) -> list[SSEEvent]:
        events: list[SSEEvent] = []
        for line in lines:
            if not line:
                if self._data is not None:
                    events.append(SSEEvent("\n".join(self._data), self._event, self._id))
                self._reset_event()
                continue
            if line[0] == ":":
                continue
            colon = line.find(":")
            if colon < 0:
                field, value = line, ""
            else:
                field = line[:colon]
                value = line[colon + 2 :] if line.startswith(" ", colon + 1) else line[colon + 1 :]
            if field == "data":
                if self._data is None:
                    self._data = [value]
                else:
                    self._data.append(value)
            elif field == "event":
                self._event = value or None
            elif field == "id" and "\0" not in value:
                self._id = value
        return events

    def _reset_event(self) -> None:
        self._data = None
        self._event = None
        self._id = None


class FrameTooLarge(Exception):
    """An event grew past the limit without ending: a provider that never ends a line."""


class FrameSplitter:
    """Cuts a byte stream into whole SSE frames (an event and the blank line that ends
    it), byte for byte as they arrived, so a relay can drop or hold back single frames and
    pass every other one on unchanged. Bounded: a frame over ``max_frame_bytes`` raises."""

    __slots__ = ("_buffer", "_max")

    _ENDINGS = (b"\n\n", b"\r\n\r\n", b"\r\r")

    def __init__(self, max_frame_bytes: int) -> None:
        self._buffer = b""
        self._max = max_frame_bytes

    def feed(self, chunk: bytes) -> list[bytes]:
        data = self._buffer + chunk if self._buffer else chunk
        if b"\r" in data:
            frames, start = self._cut(data)
        else:
            # Providers end events with LF LF: one split does what the scan below does (the
            # leftmost ending first), in C. The last piece is the unfinished event.
            *whole, rest = data.split(b"\n\n")
            frames = [frame + b"\n\n" for frame in whole]
            start = len(data) - len(rest)
        self._buffer = data[start:]
        if len(self._buffer) > self._max:
            raise FrameTooLarge(f"an SSE event grew past {self._max} bytes without ending")
        return frames

    def _cut(self, data: bytes) -> tuple[list[bytes], int]:
        frames = []
        start = 0
        while True:
            end = self._frame_end(data, start, self._ENDINGS)
            if end < 0:
                return frames, start
            frames.append(data[start:end])
            start = end

    def remainder(self) -> bytes:
        """What is left at the end of the stream: an event without its blank line."""
        rest, self._buffer = self._buffer, b""
        return rest

    @staticmethod
    def _frame_end(data: bytes, start: int, endings: tuple[bytes, ...]) -> int:
        best = -1
        for ending in endings:
            found = data.find(ending, start)
            if found >= 0 and (best < 0 or found + len(ending) < best):
                best = found + len(ending)
        return best
