"""The usage spool: an append-only file that holds every usage record until the database
has it, so that nothing is lost to a database outage or a killed process.

Each admitted request writes one line when it is admitted and one (its whole record)
when it finishes, with ``os.write`` on an ``O_APPEND`` file: once written, a line survives
the process (SIGKILL included; only a lost disk loses it). Lines go to segments rotated
every ``ROTATE_SECONDS``; a segment is deleted once every record it holds is in the
database and every request it admitted has finished. A process holds an ``flock`` on its
segments while it lives, so at start-up any segment nobody holds is a dead process's:
its finished records are replayed (the store ignores a record it has, by request id), and
a request it admitted but never finished becomes a record of its own
(``gateway_interrupted``). Exactly one record per admitted request, whatever happened.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from llm_gateway import jsonio
from llm_gateway.billing.records import UsageRecord

log = logging.getLogger("llm_gateway.billing")

ROTATE_SECONDS = 2.0
_PREFIX = "usage-"


@dataclass(slots=True)
class _Segment:
    path: Path
    fd: int
    open_requests: set[str] = field(default_factory=set)  # admitted here, not finished
    unwritten: int = 0  # finished records here the database does not have yet


class Spool:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._tag = os.urandom(4).hex()  # two gateways in one process write apart
        self._sequence = 0
        self._segments: list[_Segment] = []
        self._where: dict[str, _Segment] = {}  # request id -> the segment that admitted it
        self._opened_at = 0.0
        self.lines = 0

    # ---- writing ----------------------------------------------------------------------

    def _current(self) -> _Segment:
        now = time.monotonic()
        if not self._segments or now - self._opened_at >= ROTATE_SECONDS:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._sequence += 1
            name = f"{_PREFIX}{os.getpid()}-{self._tag}-{self._sequence}.jsonl"
            path = self.directory / name
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # ours while we live
            self._segments.append(_Segment(path, fd))
            self._opened_at = now
            self._collect()
        return self._segments[-1]

    def _append(self, segment: _Segment, line: dict[str, UsageRecord]) -> None:
        # The record as its JSON object (money as text), the form from_json reads back.
        os.write(segment.fd, jsonio.dumps(line) + b"\n")
        self.lines += 1

    def admitted(self, record: UsageRecord) -> None:
        """A request was admitted; ``record`` is what is known of it so far."""
        segment = self._current()
        self._append(segment, {"admitted": record})
        segment.open_requests.add(record.request_id)
        self._where[record.request_id] = segment

    def finished(self, record: UsageRecord) -> _Segment:
        """The request's record; returns the segment to report it written against."""
        segment = self._current()
        self._append(segment, {"finished": record})
        segment.unwritten += 1
        admitted_in = self._where.pop(record.request_id, None)
        if admitted_in is not None:
            admitted_in.open_requests.discard(record.request_id)
        return segment

    def written(self, segments: list[_Segment]) -> None:
        """These records (one segment per record) are in the database now."""
        for segment in segments:
            segment.unwritten -= 1
        self._collect()

    @property
    def pending(self) -> int:
        """Finished records the database does not have yet."""
        return sum(segment.unwritten for segment in self._segments)

    def _collect(self) -> None:
        """Delete the segments nothing waits on any more (never the one being written)."""
        keep = []
        for segment in self._segments[:-1]:
            if segment.unwritten <= 0 and not segment.open_requests:
                with contextlib.suppress(OSError):
                    segment.path.unlink()
                os.close(segment.fd)
            else:
                keep.append(segment)
        self._segments = keep + self._segments[-1:]

    def close(self) -> None:
        """A clean shutdown: the records were flushed; segments left hold what was not."""
        self._collect()
        for segment in self._segments:
            if segment.unwritten <= 0 and not segment.open_requests:
                with contextlib.suppress(OSError):
                    segment.path.unlink()
            os.close(segment.fd)
        self._segments = []

    # ---- replaying what a dead process left ----------------------------------------------

    def orphans(self) -> Iterator[tuple[Path, list[UsageRecord]]]:
        """Each segment no living process holds, with the records to write for it."""
        if not self.directory.is_dir():
            return
        paths = sorted(self.directory.glob(f"{_PREFIX}*.jsonl"))
        held: list[tuple[Path, int]] = []
        for path in paths:
            fd = os.open(path, os.O_RDONLY)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)  # a living process's
                continue
            held.append((path, fd))
        records = _records_of([path for path, _ in held])
        try:
            for path, _ in held:
                yield path, records.pop(path, [])
        finally:
            for _, fd in held:
                os.close(fd)

    def own_unwritten(self) -> list[tuple[_Segment, list[UsageRecord]]]:
        """This process's finished records the database does not have, read back from
        the segments (after an outage longer than memory holds)."""
        found = []
        for segment in self._segments:
            if segment.unwritten > 0:
                records = [record for record in _records_of([segment.path])[segment.path]
                           if record.error_code != "gateway_interrupted"]
                found.append((segment, records))
        return found

    def all_written(self, segment: _Segment) -> None:
        segment.unwritten = 0


def _records_of(paths: list[Path]) -> dict[Path, list[UsageRecord]]:
    """The finished records of these segments, and a record for every request admitted
    but never finished (the process died under it), each under the segment it is in."""
    finished: dict[str, UsageRecord] = {}
    admitted: dict[str, tuple[Path, UsageRecord]] = {}
    by_path: dict[Path, list[UsageRecord]] = {path: [] for path in paths}
    for path in paths:
        for line in path.read_bytes().splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue  # a line cut by the kill: its record is in no database yet
            if "finished" in entry:
                record = UsageRecord.from_json(entry["finished"])
                finished[record.request_id] = record
                by_path[path].append(record)
            elif "admitted" in entry:
                record = UsageRecord.from_json(entry["admitted"])
                admitted[record.request_id] = (path, record)
    for request_id, (path, record) in admitted.items():
        if request_id not in finished:
            record.status, record.error_code = 500, "gateway_interrupted"
            record.error_message = "The gateway stopped before the request finished."
            by_path[path].append(record)
    return by_path
