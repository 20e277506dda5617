"""How the fake upstream paces a reply's content chunks, whatever the API streams them in (chat
completions, Anthropic's Messages, OpenAI's Responses): the per-request stream shape the
``x-fake-chunks`` and ``x-fake-chunk-delay-ms`` headers ask for, the wait between chunks (and
its whole length before a JSON answer), and a fault's stream failures, committed at the same
points of every API's stream so that a test means the same whichever protocol it relays."""

import time

from llm_gateway.testing.fake_exchange import Exchange
from llm_gateway.testing.fake_faults import DeliberateConnectionCut, Fault

# Which header makes the fake deviate from its configured stream shape for one request. Gateways
# forward unknown headers untouched, so tests can steer the fake through a gateway with them.
CHUNK_COUNT_HEADER = "x-fake-chunks"
CHUNK_DELAY_MS_HEADER = "x-fake-chunk-delay-ms"

# What Fault.malformed_frame slips into a stream: looks like a JSON frame, does not parse.
MALFORMED_SSE_FRAME = b"data: {not json\n\n"


def stream_settings(
    headers: dict[str, str], chunk_count: int, chunk_delay: float
) -> tuple[int, float] | str:
    """(chunk count, chunk delay) after per-request header overrides, or a problem."""
    try:
        if CHUNK_COUNT_HEADER in headers:
            chunk_count = int(headers[CHUNK_COUNT_HEADER])
        if CHUNK_DELAY_MS_HEADER in headers:
            chunk_delay = float(headers[CHUNK_DELAY_MS_HEADER]) / 1000
    except ValueError:
        return f"{CHUNK_COUNT_HEADER} and {CHUNK_DELAY_MS_HEADER} must be numbers"
    if chunk_count < 0 or chunk_delay < 0:
        return f"{CHUNK_COUNT_HEADER} and {CHUNK_DELAY_MS_HEADER} must not be negative"
    return chunk_count, chunk_delay


async def waited_as_generating(exchange: Exchange, chunk_delay: float, chunks: int) -> bool:
    """Wait as long as streaming ``chunks`` would have taken, as a JSON answer takes as long as
    generating every piece; False when the client hung up meanwhile."""
    return chunk_delay <= 0 or await exchange.wait(chunk_delay * chunks)


class ChunkPacer:
    """One stream's ``total`` content chunks on their way out: the wait before each one but the
    first, when each went (``RecordedRequest.chunk_sent_at``), and ``fault``'s stream failures:
    the connection dropped after ``cut_after_chunks`` chunks (before the stream's ending when
    there are no more) and ``malformed_frame`` sent before the middle chunk (at the end when
    there are none).

    The caller sends each chunk itself, between :meth:`before_chunk` and :meth:`chunk_sent`,
    and calls :meth:`finish` before the stream's ending."""

    def __init__(self, exchange: Exchange, fault: Fault | None, total: int, chunk_delay: float,
                 malformed_frame: bytes = MALFORMED_SSE_FRAME) -> None:
        self._exchange = exchange
        self._chunk_delay = chunk_delay
        self._total = total
        self._cut_after = fault.cut_after_chunks if fault is not None else None
        self._malformed_before = total // 2 if fault is not None and fault.malformed_frame else -1
        self._malformed_frame = malformed_frame
        recorded = exchange.recorded
        self._sent_at = recorded.chunk_sent_at if recorded is not None else None
        self._sent = 0

    async def before_chunk(self) -> bool:
        """Ready the next chunk; False when the client hung up while the fake waited."""
        if self._cut_after is not None and self._sent >= self._cut_after:
            raise DeliberateConnectionCut("fake upstream dropped the stream on purpose")
        if self._sent > 0 and self._chunk_delay > 0 \
                and not await self._exchange.wait(self._chunk_delay):
            return False
        if self._sent == self._malformed_before:
            await self._exchange.send_raw_frame(self._malformed_frame)
        return True

    def chunk_sent(self) -> None:
        if self._sent_at is not None:
            self._sent_at.append(time.monotonic())
        self._sent += 1

    async def finish(self) -> None:
        """After the last chunk: the failures a fault left for the end."""
        if self._cut_after is not None:
            # Asked to cut after at least as many chunks as there are: cut before the ending.
            raise DeliberateConnectionCut("fake upstream dropped the stream on purpose")
        if self._malformed_before == self._total:  # only when there were no chunks at all
            await self._exchange.send_raw_frame(self._malformed_frame)
