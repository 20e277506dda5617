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

A stream also writes its progress as it is relayed (``progress``: which target, the prompt's
estimate, the characters of text relayed so far; at most once per ``PROGRESS_SECONDS`` of
a stream, and at its first event), so the record of a stream the kill cut short carries
the tokens the client got, estimated as for any stream that ended without usage. An
admission line also holds the request's budget reservation, when one was taken from the
ledger (not from a lease), so that the next start settles what a dead process left held
(``Orphan``).

The spool never fails a request: a line it cannot write (a full or read-only disk, a
directory gone) is counted, logged once per failure period, and its record reaches the
database from memory only; a write is tried again once every ``RETRY_SECONDS`` until one
succeeds. At start-up, though, a spool that cannot be written is a setting to fix
(``check``): a gateway that cannot keep its no-loss promise says so before it serves.
"""

from __future__ import annotations

import contextlib
import errno
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
from llm_gateway.config import ConfigError
from llm_gateway.tokens import estimate_chars

log = logging.getLogger("llm_gateway.billing")

ROTATE_SECONDS = 2.0
# A stream's progress is written at most this often (and at its first event).
PROGRESS_SECONDS = 1.0
# While the spool cannot be written, one line in this long tries again (the others do not
# pay for a failing system call each).
RETRY_SECONDS = 1.0
_PREFIX = "usage-"


class SpoolUnwritable(ConfigError):
    """USAGE_SPOOL_DIR cannot be written: said at start-up, in one line."""

    def __init__(self, directory: Path, error: OSError) -> None:
        super().__init__(
            "USAGE_SPOOL_DIR",
            f"the usage spool {directory} cannot be written ({error.strerror or error}); "
            "give it a writable directory that outlives the process (a volume)",
        )


@dataclass(slots=True)
class _Segment:
    path: Path
    fd: int
    open_requests: set[str] = field(default_factory=set)  # admitted here, not finished
    unwritten: int = 0  # finished records here the database does not have yet
    torn: bool = False  # the last write stopped mid-line: the next starts a new line


class Spool:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._tag = os.urandom(4).hex()  # two gateways in one process write apart
        self._sequence = 0
        self._segments: list[_Segment] = []
        self._where: dict[str, _Segment] = {}  # request id -> the segment that admitted it
        self._opened_at = 0.0
        self.lines = 0
        self.failures = 0  # lines (admissions, finished records) that could not be written
        self._broken_since: float | None = None  # the spool cannot be written since then
        self._retry_at = 0.0

    def check(self) -> None:
        """At start-up: the spool can be written (its first segment is opened), else
        SpoolUnwritable."""
        try:
            self._current()
        except OSError as exc:
            raise SpoolUnwritable(self.directory, exc) from None

    # ---- writing ----------------------------------------------------------------------

    def _current(self) -> _Segment:
        now = time.monotonic()
        if not self._segments or now - self._opened_at >= ROTATE_SECONDS:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._sequence += 1
            name = f"{_PREFIX}{os.getpid()}-{self._tag}-{self._sequence}.jsonl"
            path = self.directory / name
            # Made under a name ``orphans`` does not look at, and named only once locked:
            # another process starting now must never take it for a dead one's.
            hidden = self.directory / f".{name}"
            fd = os.open(hidden, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # ours while we live
                os.rename(hidden, path)
            except OSError:
                os.close(fd)
                hidden.unlink(missing_ok=True)
                raise
            self._segments.append(_Segment(path, fd))
            self._opened_at = now
            self._collect()
        return self._segments[-1]

    def _append(self, segment: _Segment, line: dict[str, object]) -> None:
        # The record as its JSON object (money as text), the form from_json reads back.
        data = jsonio.dumps(line) + b"\n"
        if segment.torn:
            data = b"\n" + data  # the cut line stays unreadable; this one stays whole
        written = os.write(segment.fd, data)
        segment.torn = written < len(data)
        if segment.torn:  # the disk filled up mid-line
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.lines += 1

    def _write(self, line: dict[str, object]) -> _Segment | None:
        """Append one line; the segment it is in, or None when the spool cannot be
        written: never an exception, for no request may fail on the spool."""
        broken_since = self._broken_since
        if broken_since is not None and time.monotonic() < self._retry_at:
            self.failures += 1
            return None
        try:
            segment = self._current()
            self._append(segment, line)
        except OSError as exc:
            now = time.monotonic()
            self.failures += 1
            self._retry_at = now + RETRY_SECONDS
            if broken_since is None:
                self._broken_since = now
                log.error("usage spool %s cannot be written (%s): serving on, usage records "
                          "go to the database from memory only (a crash now loses those not "
                          "written yet)", self.directory, exc.strerror or type(exc).__name__)
            return None
        if broken_since is not None:
            log.warning("usage spool %s can be written again, after %.1fs",
                        self.directory, time.monotonic() - broken_since)
            self._broken_since = None
        return segment

    def admitted(self, record: UsageRecord, reservation: dict[str, object] | None = None) -> None:
        """A request was admitted; ``record`` is what is known of it so far, and
        ``reservation`` (JSON) what it holds on the ledger."""
        line: dict[str, object] = {"admitted": record}
        if reservation is not None:
            line["reservation"] = reservation
        segment = self._write(line)
        if segment is not None:
            segment.open_requests.add(record.request_id)
            self._where[record.request_id] = segment

    def progress(self, request_id: str, facts: dict[str, object]) -> None:
        """How far an admitted stream has got: ``facts`` (provider, upstream_model,
        prompt_tokens, text_chars) replace what an earlier line said."""
        if request_id in self._where:
            self._write({"progress": {"request_id": request_id, **facts}})

    def finished(self, record: UsageRecord) -> _Segment | None:
        """The request's record; returns the segment to report it written against (None:
        it could not be spooled, memory alone holds it)."""
        admitted_in = self._where.pop(record.request_id, None)
        if admitted_in is not None:
            admitted_in.open_requests.discard(record.request_id)
        segment = self._write({"finished": record})
        if segment is not None:
            segment.unwritten += 1
        return segment

    def written(self, segments: list[_Segment | None]) -> None:
        """These records (one segment per record; None: not in the spool) are in the
        database now."""
        for segment in segments:
            if segment is not None:
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

    def orphans(self) -> Iterator[tuple[Path, list[Orphan]]]:
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
                records = [orphan.record for orphan in _records_of([segment.path])[segment.path]
                           if orphan.record.error_code != "gateway_interrupted"]
                found.append((segment, records))
        return found

    def all_written(self, segment: _Segment) -> None:
        segment.unwritten = 0


@dataclass(slots=True)
class Orphan:
    """A record a dead process left (finished, or made now for a request it never
    finished), with the reservation its admission line names (JSON; None: none taken
    from the ledger)."""

    record: UsageRecord
    reservation: dict[str, object] | None = None


def _records_of(paths: list[Path]) -> dict[Path, list[Orphan]]:
    """The finished records of these segments, and a record for every request admitted
    but never finished (the process died under it), each under the segment it is in."""
    finished: dict[str, UsageRecord] = {}
    admitted: dict[str, tuple[Path, UsageRecord]] = {}
    reservations: dict[str, dict[str, object]] = {}
    progress: dict[str, dict[str, object]] = {}
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
            elif "progress" in entry:
                facts = entry["progress"]
                progress[str(facts.get("request_id"))] = facts
            elif "admitted" in entry:
                record = UsageRecord.from_json(entry["admitted"])
                admitted[record.request_id] = (path, record)
                if isinstance(entry.get("reservation"), dict):
                    reservations[record.request_id] = entry["reservation"]
    for request_id, (path, record) in admitted.items():
        if request_id not in finished:
            record.status, record.error_code = 500, "gateway_interrupted"
            record.error_message = "The gateway stopped before the request finished."
            if request_id in progress:
                _estimated_from(record, progress[request_id])
            by_path[path].append(record)
    return {path: [Orphan(record, reservations.get(record.request_id)) for record in records]
            for path, records in by_path.items()}


def _estimated_from(record: UsageRecord, facts: dict[str, object]) -> None:
    """What a stream cut by the kill had relayed, estimated as the exchange estimates a
    stream that ended without usage (tokens.py: four characters a token)."""
    record.provider = str(facts.get("provider") or "")
    record.upstream_model = str(facts["upstream_model"]) if facts.get("upstream_model") else None
    prompt, chars = facts.get("prompt_tokens"), facts.get("text_chars")
    record.prompt_tokens = prompt if isinstance(prompt, int) else 0
    record.completion_tokens = estimate_chars(chars) if isinstance(chars, int) else 0
    record.total_tokens = record.prompt_tokens + record.completion_tokens
    record.tokens_estimated = True
