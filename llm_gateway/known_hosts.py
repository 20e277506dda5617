"""The LLM hosts the sidecar knows without being told (``data/known_llm_hosts.yaml``), the
settings that extend and override that list (``known_llm_hosts: {extra, remove}``), and
what a host name may be before it is logged or becomes a metric label.

A known host that no configured provider serves is never tunnelled: an app calling
``api.openai.com`` with a provider key of its own would otherwise pass through the sidecar
ungoverned. Which hosts a provider serves, and what is answered, is ``interception``'s;
this module is the list and its matching, pure (a mapping in, values out).

A pattern is a host name in which ``*`` stands for one label or part of one (letters,
digits and ``-``, never a dot), so ``*.openai.azure.com`` matches ``res.openai.azure.com``
and not ``a.b.openai.azure.com``; the last two labels hold no ``*`` (``*.com`` would take
in every host of a top-level domain).
"""

from __future__ import annotations

import functools
import ipaddress
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any

import yaml

# How a known host's clients read an error (interception writes each): OpenAI's
# {"error": {...}}, Anthropic's, Google's (Gemini and Vertex), AWS's (a message, the type
# in x-amzn-ErrorType) and Cohere's ({"message"}).
PROTOCOLS = ("openai", "anthropic", "google", "bedrock", "cohere")
DATA_FILE = "known_llm_hosts.yaml"
_LABEL = re.compile(r"[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?")
_PATTERN_LABEL = re.compile(r"[a-z0-9_*-]{1,63}")
_WILDCARD = "[a-z0-9-]+"


def hostname(value: str) -> str | None:
    """``value`` as a host name fit for a log line or a label (lower case, no final dot):
    DNS labels of letters, digits, ``-`` and ``_``, or an IP address; else None."""
    name = value.strip().lower().rstrip(".")
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    try:
        return str(ipaddress.ip_address(name))
    except ValueError:
        pass
    if not name or len(name) > 253 or not name.isascii():
        return None
    return name if all(_LABEL.fullmatch(label) for label in name.split(".")) else None


@dataclass(frozen=True, slots=True)
class KnownHost:
    """One entry of the list: a host pattern, the provider it is, its clients' protocol."""

    pattern: str
    provider: str
    protocol: str

    def matches(self, host: str) -> bool:
        """Whether ``host`` (lower case, no final dot) is of this pattern."""
        return _compiled(self.pattern).fullmatch(host) is not None

    @property
    def wildcard(self) -> bool:
        return "*" in self.pattern


@functools.lru_cache(maxsize=1024)
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(host_regex(pattern))


def host_regex(pattern: str) -> str:
    """The regular expression of a host pattern (no anchors, no port)."""
    return r"\.".join(_WILDCARD.join(re.escape(part) for part in label.split("*"))
                      for label in pattern.split("."))


@dataclass(frozen=True, slots=True)
class KnownHostsChange:
    """The settings' ``known_llm_hosts:``: entries added (or replacing the packaged entry
    of the same pattern) and packaged patterns removed."""

    extra: tuple[KnownHost, ...] = ()
    remove: tuple[str, ...] = ()


class KnownHosts:
    """A list of known hosts, matched exact names first, then patterns in list order."""

    def __init__(self, entries: Iterable[KnownHost]) -> None:
        self.entries = tuple(entries)
        self._exact = {entry.pattern: entry for entry in self.entries if not entry.wildcard}
        self._wildcards = tuple(entry for entry in self.entries if entry.wildcard)

    @classmethod
    def packaged(cls) -> KnownHosts:
        return cls(packaged_entries())

    def changed(self, change: KnownHostsChange) -> KnownHosts:
        """This list without ``change.remove``, with ``change.extra`` (each replacing an
        entry of its pattern)."""
        replaced = {entry.pattern for entry in change.extra} | set(change.remove)
        kept = [entry for entry in self.entries if entry.pattern not in replaced]
        return KnownHosts([*kept, *change.extra])

    def find(self, host: str) -> KnownHost | None:
        """The entry ``host`` (a name, any case, maybe with a final dot) matches."""
        name = host.lower().rstrip(".")
        exact = self._exact.get(name)
        if exact is not None:
            return exact
        return next((entry for entry in self._wildcards if entry.matches(name)), None)

    def __len__(self) -> int:
        return len(self.entries)


@functools.lru_cache(maxsize=1)
def packaged_entries() -> tuple[KnownHost, ...]:
    """The list shipped in the package (``llm_gateway/data/known_llm_hosts.yaml``)."""
    text = resources.files("llm_gateway").joinpath("data", DATA_FILE).read_text()
    loaded = yaml.safe_load(text) or {}
    return parse_entries(loaded.get("hosts"))


def parse_entries(raw: Any) -> tuple[KnownHost, ...]:
    """``{pattern: {provider, protocol}}`` (``provider`` may be left out), checked;
    ValueError names the entry that is wrong."""
    if not isinstance(raw, Mapping):
        raise ValueError("expected a mapping of host pattern to {provider, protocol}")
    entries = []
    for pattern, value in raw.items():
        name = str(pattern).strip().lower()
        problem = pattern_problem(name)
        if problem is not None:
            raise ValueError(f"{pattern!r}: {problem}")
        if not isinstance(value, Mapping) or value.get("protocol") not in PROTOCOLS:
            raise ValueError(f"{pattern!r}: expected {{protocol: one of {', '.join(PROTOCOLS)}}}"
                             f" (and optionally provider: a name)")
        provider = str(value.get("provider") or name)
        entries.append(KnownHost(name, provider, str(value["protocol"])))
    return tuple(entries)


def pattern_problem(pattern: str) -> str | None:
    """Why ``pattern`` is no host pattern, or None."""
    labels = pattern.split(".")
    if len(labels) < 2 or not all(_PATTERN_LABEL.fullmatch(label) for label in labels):
        return "expected a host name, '*' standing for one label or part of one"
    if any("*" in label for label in labels[-2:]):
        return "the last two labels must be spelt out (no '*')"
    if hostname(pattern.replace("*", "x")) is None:
        return "not a host name"
    return None


def parse_change(raw: Any) -> KnownHostsChange:
    """The settings file's ``known_llm_hosts:`` (``extra``: entries; ``remove``: patterns
    of the packaged list); ValueError says what is wrong."""
    if not isinstance(raw, Mapping) or not set(raw) <= {"extra", "remove"} or not raw:
        raise ValueError("expected a mapping with 'extra' (host pattern: {provider, "
                         "protocol}) and/or 'remove' (a list of packaged host patterns)")
    extra = parse_entries(raw["extra"]) if raw.get("extra") is not None else ()
    removed = raw.get("remove") or []
    if not isinstance(removed, list):
        raise ValueError("'remove' must be a list of host patterns")
    packaged = {entry.pattern for entry in packaged_entries()}
    remove = tuple(str(pattern).strip().lower() for pattern in removed)
    if unknown := [pattern for pattern in remove if pattern not in packaged]:
        raise ValueError(f"'remove': {unknown[0]!r} is not in the packaged list "
                         f"({', '.join(sorted(packaged))})")
    return KnownHostsChange(extra, remove)
