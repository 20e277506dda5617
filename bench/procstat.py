"""What a process costs, read from /proc: resident memory and CPU time, over a process tree.

A target may be more than one process (a launcher script that forks its server, a worker
manager), so every figure covers the process and all its descendants.
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass
from pathlib import Path

CLOCK_TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")
PAGE_SIZE_BYTES = os.sysconf("SC_PAGE_SIZE")


def _stat_fields(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces: split after it.
    return raw[raw.rindex(")") + 2 :].split()


def _children(pid: int) -> list[int]:
    children: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return children
    for task in tasks:
        try:
            listed = Path(f"/proc/{pid}/task/{task}/children").read_text().split()
        except OSError:
            continue
        children.extend(int(child) for child in listed)
    return children


def process_tree(pid: int) -> list[int]:
    """``pid`` and every live descendant."""
    tree: list[int] = []
    pending = [pid]
    while pending:
        current = pending.pop()
        if _stat_fields(current) is None:
            continue
        tree.append(current)
        pending.extend(_children(current))
    return tree


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of the process tree (all threads), in seconds."""
    ticks = 0
    for member in process_tree(pid):
        fields = _stat_fields(member)
        if fields is not None:
            # After the name: state is index 0, so utime (field 14) is 11, stime is 12.
            ticks += int(fields[11]) + int(fields[12])
    return ticks / CLOCK_TICKS_PER_SECOND


def rss_bytes(pid: int) -> int:
    """Resident set size of the process tree, in bytes."""
    total = 0
    for member in process_tree(pid):
        try:
            pages = int(Path(f"/proc/{member}/statm").read_text().split()[1])
        except (OSError, IndexError, ValueError):
            continue
        total += pages * PAGE_SIZE_BYTES
    return total


@dataclass(frozen=True)
class CpuSample:
    """A CPU-time reading to subtract from a later one."""

    pid: int
    seconds: float

    @classmethod
    def take(cls, pid: int) -> CpuSample:
        return cls(pid, cpu_seconds(pid))

    def elapsed(self) -> float:
        return cpu_seconds(self.pid) - self.seconds


# Thousands of streams need thousands of sockets in the client, the upstream and each gateway
# (two per stream): every process of a run gets this many file descriptors, or its hard limit.
FD_LIMIT = 65536


def raise_fd_limit(wanted: int = FD_LIMIT) -> int:
    """Raise this process's open-file limit: the soft limit to ``wanted`` when the hard limit
    allows, and the hard limit too when privileged. Returns the soft limit in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= wanted:
        return soft
    if hard == resource.RLIM_INFINITY or hard >= wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        return wanted
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, wanted))
        return wanted
    except (ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        return hard


def connections_held(pid: int, port: int) -> int:
    """The established TCP connections to local ``port`` that process ``pid`` holds (Linux
    /proc, IPv4): a worker's accepted clients; 0 where /proc cannot tell."""
    inodes = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return 0
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    try:
        lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return 0
    return sum(1 for fields in map(str.split, lines)
               if fields[3] == "01" and int(fields[1].rsplit(":", 1)[1], 16) == port
               and fields[9] in inodes)


def connections_per_worker(supervisor: int, port: int) -> list[int]:
    """Each worker's (child's) established connections to ``port``, largest first."""
    return sorted((connections_held(child, port) for child in _children(supervisor)),
                  reverse=True)
